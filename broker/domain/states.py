"""The eleven lifecycle states and the table of allowed transitions (README, "The lifecycle",
whose state table tests/unit/test_readme.py holds to this enum)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"
    VALIDATING = "VALIDATING"
    REJECTED = "REJECTED"
    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    RETRYING = "RETRYING"


S = JobState

# FAILED is final for users and for the ledger, but the retry engine may move it on to
# RETRYING; a rule checks that such a move carries a retry decision.
TERMINAL: frozenset[JobState] = frozenset({S.REJECTED, S.SUCCEEDED, S.FAILED, S.CANCELLED})

# States whose reason may change without a state change (a queued job's wait reason moves
# from QuotaExhausted to InsufficientCapacity, a preparing job starts pulling images).
REASON_UPDATES: frozenset[JobState] = frozenset(
    {S.QUEUED, S.ADMITTED, S.PREPARING, S.RUNNING, S.RETRYING}
)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.SUBMITTED: frozenset({S.VALIDATING, S.CANCELLED}),
    S.VALIDATING: frozenset({S.REJECTED, S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.ADMITTED, S.CANCELLED}),
    S.ADMITTED: frozenset({S.PREPARING, S.QUEUED, S.CANCELLED}),
    S.PREPARING: frozenset({S.RUNNING, S.RETRYING, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.RETRYING}),
    S.FAILED: frozenset({S.RETRYING}),
    S.RETRYING: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.REJECTED: frozenset(),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset(),
}

INITIAL = S.SUBMITTED


def is_allowed(src: JobState, dst: JobState) -> bool:
    """True when (src, dst) is in the table or is a reason update of a live state."""
    if src == dst:
        return src in REASON_UPDATES
    return dst in TRANSITIONS[src]


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL
