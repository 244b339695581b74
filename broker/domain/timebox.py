"""Date arithmetic that cannot overflow.

Durations come from stored specs and from backends (annotations, deadlines, time limits), and
neither is to be trusted: `started_at + timedelta(seconds=1e12)` raises OverflowError, and one
such job would stop every cycle that looks at it. Here the result saturates at FAR_FUTURE
(FAR_PAST for negative durations), far enough to mean "never" and far enough from
`datetime.max` that later arithmetic on it (a few hours or years either way) still works.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

FAR_FUTURE = datetime(9000, 1, 1)
FAR_PAST = datetime(1000, 1, 1)


def add_seconds(dt: datetime, seconds: float) -> datetime:
    """`dt + seconds`, clamped to [FAR_PAST, FAR_FUTURE] (in `dt`'s time zone, naive or not).
    Infinities saturate; NaN is a ValueError (it says nothing about time)."""
    if isinstance(seconds, float) and math.isnan(seconds):
        raise ValueError("a duration of NaN seconds")
    top, bottom = FAR_FUTURE.replace(tzinfo=dt.tzinfo), FAR_PAST.replace(tzinfo=dt.tzinfo)
    if seconds >= (top - dt).total_seconds():
        return max(dt, top)
    if seconds <= (bottom - dt).total_seconds():
        return min(dt, bottom)
    return dt + timedelta(seconds=seconds)

