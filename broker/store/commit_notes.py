"""Changes a transaction only notes as it goes and writes once, at its commit: the quota
counters (broker.store.quota_counters) and the ledger's daily sums (broker.store.daily_sums).

Rows shared by many jobs (a team's counter, a team's day) written where each change happens
are locked from the middle of a transaction to its end, in that transaction's own order, and
two transactions deadlock on them. Noted instead, they are written by `apply` at the
commit, last, in key order. Each note remembers the (nested) transaction it was made in: a
rolled-back savepoint drops its notes, a rolled-back transaction drops everything, and a
released savepoint keeps them for the outer commit.

Writers are called in the order they were registered (`register`), which is the order of
their modules' imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction


def note(session: Session, key: str, item: tuple[Any, ...]) -> None:
    """Note `item` under `key`, tagged with the transaction (or savepoint) in effect."""
    where = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(key, []).append((where, *item))


def noted(session: Session, key: str) -> list[tuple[Any, ...]]:
    """What is noted under `key` and not yet written, each without its transaction tag."""
    return [n[1:] for n in session.info.get(key, ())]


def take(session: Session, key: str) -> list[tuple[Any, ...]]:
    """`noted`, and forget it (its writer is writing it now)."""
    items = noted(session, key)
    session.info.pop(key, None)
    return items


def register(key: str, apply: Callable[[Session], None]) -> None:
    """Call `apply(session)` at each commit of a transaction that noted under `key` (a
    released savepoint is not such a commit), and drop a rolled-back savepoint's notes."""

    @event.listens_for(Session, "before_commit")
    def _before_commit(session: Session) -> None:
        if session.info.get(key) and not session.in_nested_transaction():
            apply(session)

    @event.listens_for(Session, "after_soft_rollback")
    def _after_rollback(session: Session, previous: SessionTransaction) -> None:
        items = session.info.get(key)
        if items:
            items[:] = [n for n in items if not _within(n[0], previous)]


def _within(where: SessionTransaction | None, ended: SessionTransaction) -> bool:
    while where is not None:
        if where is ended:
            return True
        where = where.parent
    return False
