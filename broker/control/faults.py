"""Crash injection for the crash-safety tests: `ISTHMUS_CRASH_AT=point[:n]` (comma list) makes
the process SIGKILL itself the n-th time (default 1st) it reaches `point`. Unset in production,
where `crash_point` is one dictionary look-up.

`ISTHMUS_STOP_AT=point[:n]` instead makes the process SIGSTOP itself there (a leader paused in
the middle of its work, for the fencing test); the test resumes it with SIGCONT."""

from __future__ import annotations

import os
import signal

from sqlalchemy import event
from sqlalchemy.orm import Session

from broker.store.records import STATE_WRITTEN

POINTS = (
    "after-intent-commit",  # an admission (and its outbox intent) is committed
    "after-backend-create",  # the backend object exists, nothing recorded yet
    "before-fact-persist",  # facts observed, not stored or applied
    "mid-cycle",  # between two admissions of one cycle
    "before-cycle-record",  # an admission cycle decided, its record not yet written
    "after-state-commit",  # any transaction that changed a job's state has just committed
)


def _parse(spec: str, var: str = "ISTHMUS_CRASH_AT") -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, n = item.partition(":")
        if name not in POINTS:
            raise ValueError(f"{var}: unknown point '{name}'; known: {POINTS}")
        out[name] = int(n or 1)
    return out


_ARMED = _parse(os.environ.get("ISTHMUS_CRASH_AT", ""))
_STOPS = _parse(os.environ.get("ISTHMUS_STOP_AT", ""), "ISTHMUS_STOP_AT")
_SEEN: dict[str, int] = {}


def crash_point(name: str) -> None:
    if not (_ARMED or _STOPS) or (name not in _ARMED and name not in _STOPS):
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] == _ARMED.get(name):
        os.kill(os.getpid(), signal.SIGKILL)
    if _SEEN[name] == _STOPS.get(name):
        os.kill(os.getpid(), signal.SIGSTOP)


def _after_commit(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint released: nothing is committed yet
    if session.info.pop(STATE_WRITTEN, False):
        crash_point("after-state-commit")


if "after-state-commit" in _ARMED or "after-state-commit" in _STOPS:
    # every commit point of a job's lifecycle, whoever commits it (API, admission,
    # dispatch, reconcile, preemption, retry): n-th such commit, then SIGKILL
    event.listen(Session, "after_commit", _after_commit)
