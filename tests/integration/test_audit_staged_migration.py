"""Migration 0022_audit_staged: upgrade makes the staged records' table (its trigger refuses
UPDATE); downgrade refuses while records wait there, naming what to do, and drops it once they
are linked; on both databases."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from broker.store import audit_log, migrate
from broker.store.db import Database, connect

ENTRY = audit_log.Entry(
    actor="ada", actor_team=None, actor_admin=True, action="pool.drain", method="POST",
    route="/v1/admin/pools/{pool}/drain", target="pool:slurm-h100", outcome="allowed",
    status=200, request_id="r0")


def _tables(db: Database) -> set[str]:
    return set(sa.inspect(db.writer).get_table_names())


def test_upgrade_and_a_downgrade_that_keeps_no_record_from_the_chain(empty_url: str) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db)
        assert "audit_staged" in _tables(db)
        with db.write() as s:
            audit_log.stage(s, [ENTRY])
        with pytest.raises(RuntimeError, match=r"1 audit records are staged .* start "
                                               r"`isthmus server`"):
            migrate.downgrade(db, "0021_ledger_release_time")
        assert "audit_staged" in _tables(db)  # nothing dropped, the record still there
        assert audit_log.link_staged(db) == 1
        migrate.downgrade(db, "0021_ledger_release_time")
        assert "audit_staged" not in _tables(db) and "audit_log" in _tables(db)
        migrate.upgrade(db)
        assert "audit_staged" in _tables(db)
    finally:
        db.dispose()
