"""Crash injection for the crash-safety tests: `ISTHMUS_CRASH_AT=point[:n]` (comma list) makes
the process SIGKILL itself the n-th time (default 1st) it reaches `point`. Unset in production,
where `crash_point` is one dictionary look-up."""

from __future__ import annotations

import os
import signal

POINTS = (
    "after-intent-commit",  # an admission (and its outbox intent) is committed
    "after-backend-create",  # the backend object exists, nothing recorded yet
    "before-fact-persist",  # facts observed, not stored or applied
    "mid-cycle",  # between two admissions of one cycle
)


def _parse(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, n = item.partition(":")
        if name not in POINTS:
            raise ValueError(f"ISTHMUS_CRASH_AT: unknown point '{name}'; known: {POINTS}")
        out[name] = int(n or 1)
    return out


_ARMED = _parse(os.environ.get("ISTHMUS_CRASH_AT", ""))
_SEEN: dict[str, int] = {}


def crash_point(name: str) -> None:
    if not _ARMED or name not in _ARMED:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)
