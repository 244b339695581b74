"""Migration 0018_notices: upgrade makes the outbox and its deliveries, downgrade drops them,
on both databases."""

from __future__ import annotations

import sqlalchemy as sa

from broker.store import migrate
from broker.store.db import Database, connect


def _tables(db: Database) -> set[str]:
    return set(sa.inspect(db.writer).get_table_names())


def test_upgrade_and_downgrade(empty_url: str) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db)
        assert {"notices", "notice_deliveries"} <= _tables(db)
        migrate.downgrade(db, "0017_idle_cycles")
        assert not {"notices", "notice_deliveries"} & _tables(db)
        migrate.upgrade(db)
        assert {"notices", "notice_deliveries"} <= _tables(db)
    finally:
        db.dispose()
