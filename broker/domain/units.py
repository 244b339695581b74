"""Parsing of the human units used in job specs: durations ("2h", "1h30m") and sizes ("64Gi").

Every parse takes the largest value the field allows, so nothing out of range is ever built:
arithmetic with these values (deadlines, rendered scripts, database columns) cannot overflow.
Input of any JSON type is answered with a ValueError naming what to write, never another
exception (which the API would turn into a 500).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?B?")
_SIZE_FACTORS = {
    None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
# Longer text is refused before any arithmetic: "9" * 200_000 must not reach int().
_MAX_TEXT = 32


def parse_duration(value: object, maximum: int | None = None) -> int:
    """Seconds from "2h", "90m", "1h30m", "45s", "1d" or a whole number of seconds, refused
    above `maximum` seconds."""
    hint = "write it like '2h', '90m', '1h30m' or '45s', or give whole seconds"
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '2h' or '90m', got a boolean")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be a finite number of seconds; {hint}")
        if not value.is_integer():
            raise ValueError(f"a duration in seconds must be a whole number; {hint}")
        value = int(value)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        text = value.strip().lower()
        if len(text) > _MAX_TEXT:
            limit = f" at most {format_duration(maximum)}" if maximum else ""
            raise ValueError(f"'{text[:12]}...' is too long for a duration;{limit} ({hint})")
        m = _DURATION.fullmatch(text)
        if text.isascii() and text.isdigit():
            seconds = int(text)
        elif not text or m is None or not any(m.groups()):
            raise ValueError(f"'{value}' is not a duration; {hint}")
        else:
            d, h, mi, s = (int(g) if g else 0 for g in m.groups())
            seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    else:
        raise ValueError(f"expected a duration, got {_kind(value)}; {hint}")
    if seconds <= 0:
        raise ValueError("must be a positive duration")
    if maximum is not None and seconds > maximum:
        raise ValueError(f"must be at most {format_duration(maximum)}")
    return seconds


def format_duration(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def approx_duration(seconds: float) -> str:
    """A duration for people, rounded to its two largest units ("1h05m", "3d02h"); the exact
    form a spec round-trips is `format_duration`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def parse_size(value: object, maximum: int | None = None) -> int:
    """Bytes from "64Gi", "512Mi", "2G" or a whole number of bytes, refused above `maximum`."""
    hint = "write it like '64Gi' or '512Mi', or give whole bytes"
    if isinstance(value, bool):
        raise ValueError("expected a size such as '64Gi', got a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"a size in bytes must be a finite whole number; {hint}")
        value = int(value)
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > _MAX_TEXT:
            limit = f" at most {format_size(maximum)}" if maximum else ""
            raise ValueError(f"'{text[:12]}...' is too long for a size;{limit} ({hint})")
        m = _SIZE.fullmatch(text)
        if m is None:
            raise ValueError(f"'{value}' is not a size; {hint}")
        size = int(Fraction(m.group(1)) * _SIZE_FACTORS[m.group(2)])
    else:
        raise ValueError(f"expected a size, got {_kind(value)}; {hint}")
    if size <= 0:
        raise ValueError("must be a positive size")
    if maximum is not None and size > maximum:
        raise ValueError(f"must be at most {format_size(maximum)}")
    return size


def format_size(size: int) -> str:
    """The largest binary unit that states `size` exactly: 16Ti, 512Mi, 1000 (bytes)."""
    for unit in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _SIZE_FACTORS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def duration_parser(maximum: int) -> Callable[[object], int]:
    """parse_duration bounded by `maximum`, for a pydantic BeforeValidator."""
    return lambda value: parse_duration(value, maximum)


def size_parser(maximum: int) -> Callable[[object], int]:
    """parse_size bounded by `maximum`, for a pydantic BeforeValidator."""
    return lambda value: parse_size(value, maximum)


def _kind(value: object) -> str:
    return {list: "a list", dict: "an object", type(None): "null"}.get(
        type(value), type(value).__name__
    )
