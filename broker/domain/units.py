"""Parsing of the human units used in job specs: durations ("2h", "1h30m") and sizes ("64Gi")."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T)?B?")
_SIZE_FACTORS = {
    None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


def parse_duration(value: str | int | float) -> int:
    """Seconds from "2h", "90m", "1h30m", "45s", "1d" or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '2h' or '90m', got a boolean")
    if isinstance(value, int | float):
        seconds = int(value)
    else:
        text = value.strip().lower()
        if text.isdigit():
            seconds = int(text)
        else:
            m = _DURATION.fullmatch(text)
            if not text or m is None or not any(m.groups()):
                raise ValueError(
                    f"'{value}' is not a duration; write it like '2h', '90m', '1h30m' or '45s'"
                )
            d, h, mi, s = (int(g) if g else 0 for g in m.groups())
            seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds <= 0:
        raise ValueError("must be a positive duration")
    return seconds


def format_duration(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def parse_size(value: str | int) -> int:
    """Bytes from "64Gi", "512Mi", "2G" or a plain number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '64Gi', got a boolean")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE.fullmatch(value.strip())
        if m is None:
            raise ValueError(f"'{value}' is not a size; write it like '64Gi' or '512Mi'")
        size = int(float(m.group(1)) * _SIZE_FACTORS[m.group(2)])
    if size <= 0:
        raise ValueError("must be a positive size")
    return size
