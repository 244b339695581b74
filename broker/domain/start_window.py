"""The window a waiting job's start is likely to fall in, and its one text on every surface.

policies/eta.py projects it (the queue played forward with short and long run lengths from
history); the stored explanation carries it as `start_window` {earliest, latest, coverage};
`isthmus status/list/explain`, `isqueue --start`, `isbatch --test-only`, the dashboard and the
API show it as "likely 12-05 20:40-21:10 UTC (80%)": the start is expected inside it for the
stated share of jobs (measured: bench/eta_accuracy.py, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def likely(earliest: datetime, latest: datetime, coverage: float) -> str:
    """'likely 12-05 20:40-21:10 UTC (80%)'; both dates when the window crosses midnight."""
    a, b = earliest.astimezone(UTC), latest.astimezone(UTC)
    end = b.strftime("%H:%M") if a.date() == b.date() else b.strftime("%m-%d %H:%M")
    sep = "-" if a.date() == b.date() else " - "
    return f"likely {a:%m-%d %H:%M}{sep}{end} UTC ({coverage:.0%})"


def likely_of(window: Mapping[str, Any] | None) -> str | None:
    """The text of a window as the API gives it (JSON), None when absent or unreadable."""
    if not window:
        return None
    try:
        return likely(_time(window["earliest"]), _time(window["latest"]),
                      float(window["coverage"]))
    except (KeyError, TypeError, ValueError):
        return None


def _time(v: Any) -> datetime:
    at = v if isinstance(v, datetime) else datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=UTC)
