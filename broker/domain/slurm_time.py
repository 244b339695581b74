"""Slurm's time strings, both ways: the one home for reading and writing them.

Slurm writes a duration as ``[D-]HH:MM:SS`` (sacct's Elapsed and Timelimit, scontrol's RunTime
and TimeLimit) or, in squeue's TIME and TIME_LIMIT columns, without leading zero fields
(``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``); it reads sbatch's ``--time`` in any of ``M``,
``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``, or ``INFINITE``/``UNLIMITED``. What sacct
writes is a subset of what sbatch reads, with the same meaning, so one parser serves both.
"""

from __future__ import annotations

import re

INFINITE_WORDS = ("infinite", "unlimited")
_INT = re.compile(r"[0-9]+")


def _digits(part: str) -> int:
    if not _INT.fullmatch(part):
        raise ValueError(f"'{part}' is not a number of days, hours, minutes or seconds")
    return int(part)


def parse(text: str) -> int | None:
    """Seconds from M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (None for INFINITE / UNLIMITED);
    ValueError otherwise.

    Like Slurm, fields are not range-checked ("90" minutes, "1:90" = 1 min 90 s) and "D-"
    means D days.
    """
    value = text.strip()
    if value.lower() in INFINITE_WORDS:
        return None
    if "-" in value:
        day_text, rest = value.split("-", 1)
        days = _digits(day_text)
        parts = rest.split(":") if rest else ["0"]
        if len(parts) > 3:
            raise ValueError(f"'{text}' has more than three fields after the days")
        h, m, s = ([_digits(p) for p in parts] + [0, 0])[:3]
        return ((days * 24 + h) * 60 + m) * 60 + s
    nums = [_digits(p) for p in value.split(":")]
    if len(nums) == 1:
        return nums[0] * 60
    if len(nums) == 2:
        return nums[0] * 60 + nums[1]
    if len(nums) == 3:
        return (nums[0] * 60 + nums[1]) * 60 + nums[2]
    raise ValueError(f"'{text}' has more than three fields")


def long_form(seconds: int) -> str:
    """sacct's Elapsed and Timelimit, scontrol's RunTime and TimeLimit: [D-]HH:MM:SS."""
    days, rest = divmod(max(0, seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{h:02d}:{m:02d}:{s:02d}"


def short_form(seconds: int) -> str:
    """squeue's TIME and TIME_LIMIT: M:SS, H:MM:SS, D-HH:MM:SS."""
    days, rest = divmod(max(0, seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if days:
        return f"{days}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"
