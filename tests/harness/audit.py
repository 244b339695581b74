"""The audit log as tests read it: every record, oldest first, or its (action, target, actor,
status) lines."""

from __future__ import annotations

from broker.store import Database, audit_log


def records(db: Database) -> list[audit_log.Record]:
    """As the log's readers see it: the records staged so far linked first."""
    audit_log.link_staged(db)
    with db.read() as s:
        return audit_log.oldest_first(s, audit_log.Filters(), 0, 100_000)


def lines(db: Database) -> list[tuple[str, str, str, int]]:
    """(action, target, actor, status) of every record, oldest first."""
    return [(r.action, r.target, r.actor, r.status) for r in records(db)]


def intact(db: Database) -> bool:
    audit_log.link_staged(db)
    with db.read() as s:
        return audit_log.verify(s).broken is None
