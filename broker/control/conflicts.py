"""Transactions PostgreSQL aborted for a lock conflict (a deadlock victim, a serialization
failure): nothing of them was kept, so the control loop writes them again instead of ending
its pass (under the soak one deadlock with a cancel threw a whole admission or reconcile pass
away)."""

from __future__ import annotations

CONFLICT_RETRIES = 3
"""A transaction aborted by a lock conflict is written again this many times before the pass
gives up."""
_CONFLICTS = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure


def conflict(exc: BaseException) -> bool:
    """Whether `exc` is a transaction PostgreSQL aborted for a lock conflict (to do again)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in _CONFLICTS
