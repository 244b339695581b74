"""Revision 0013 drops revision 0011's trigger on ledger_entries (and on PostgreSQL its
function): a raw insert no longer changes ledger_daily. Its downgrade makes the trigger again,
and upgrading once more drops it again; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from broker.store import migrate
from broker.store.db import Database, connect
from broker.store.records import JOBS
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

T0 = datetime(2026, 11, 30, 9, tzinfo=UTC)


def _triggers(db: Database) -> set[str]:
    """Triggers and trigger functions of the schema, by name."""
    with db.read() as s:
        if db.is_sqlite:
            sql = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        else:
            sql = ("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal UNION "
                   "SELECT proname FROM pg_proc WHERE proname = 'isthmus_ledger_daily'")
        return {r[0] for r in s.connection().exec_driver_sql(sql)}


def _book(db: Database, attempt: int) -> int:
    """Insert one usage entry as a raw writer would; ledger_daily's rows after it."""
    with db.write() as s:
        s.connection().execute(sa.insert(ENTRIES), [
            {"job_id": "J000000000000001", "attempt": attempt, "kind": "usage",
             "team": "vision", "flavor": "h100-80g", "gpus": 8, "borrowed_gpus": 0,
             "gpu_hours": 2.0, "at": T0, "note": "", "cost": 4.0, "pool": "p",
             "submitted_by": "u"}])
    with db.read() as s:
        return int(s.connection().execute(sa.select(sa.func.coalesce(
            sa.func.sum(DAILY.c.entries), 0))).scalar_one())


def test_revision_0013_drops_the_trigger_and_its_downgrade_restores_it(empty_url: str) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db, "0012")
        with db.write() as s:
            s.connection().execute(sa.insert(JOBS), [{
                "id": "J000000000000001", "name": "j", "team": "vision", "queue": "default",
                "priority": "normal", "state": "SUCCEEDED", "reason": "Succeeded",
                "message": "", "attempt": 1, "last_seq": 1, "total_gpus": 8,
                "spec_json": "{}", "spec_hash": "x" * 64, "submitted_by": "u",
                "created_at": T0, "updated_at": T0, "exclude_json": "{}"}])
        assert "ledger_daily_rollup" in _triggers(db)
        assert _book(db, 1) == 4  # the trigger: one row per grouping
        migrate.upgrade(db)
        assert _triggers(db) & {"ledger_daily_rollup", "isthmus_ledger_daily"} == set()
        assert _book(db, 2) == 4  # no trigger: a raw insert adds nothing
        migrate.downgrade(db, "0012")
        assert "ledger_daily_rollup" in _triggers(db)
        assert _book(db, 3) == 8
        migrate.upgrade(db)
        assert _triggers(db) & {"ledger_daily_rollup", "isthmus_ledger_daily"} == set()
        assert _book(db, 4) == 8
    finally:
        db.dispose()
