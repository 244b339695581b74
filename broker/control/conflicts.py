"""Transactions PostgreSQL aborted for a lock conflict (a deadlock victim, a serialization
failure): nothing of them was kept, so the control loop writes them again instead of ending
its pass (under the soak one deadlock with a cancel threw a whole admission or reconcile pass
away). Which errors are conflicts: broker.store.conflicts (the API's writes are done
again the same way)."""

from __future__ import annotations

from broker.store.conflicts import conflict

__all__ = ["CONFLICT_RETRIES", "conflict"]

CONFLICT_RETRIES = 3
"""A transaction aborted by a lock conflict is written again this many times before the pass
gives up."""
