"""Pooled PostgreSQL connections the server closed are replaced at checkout, without a
round trip per transaction (broker.store.db: no pool_pre_ping). Before pool_pre_ping was
dropped, this is what it bought; without either, the first transaction on a terminated
backend's connection failed (a 500 for the request that drew it)."""

from __future__ import annotations

import sqlalchemy as sa

from broker.store.db import Database
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.wait import wait_until

pytestmark = POSTGRES_ONLY  # row-lock order matters only where rows are locked


def _backends(db: Database) -> int:
    """Backends of the database but this one, seen from a connection outside the pool (a
    pooled one could be drawn before its backend's farewell arrived)."""
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")).scalar_one())
    finally:
        engine.dispose()


def _hold_connections(db: Database, n: int) -> None:
    """Check out n connections at once, so the pool keeps n open ones."""
    sessions = [db.write() for _ in range(n)]
    try:
        for cm in sessions:
            cm.__enter__().connection().execute(sa.text("SELECT 1"))
    finally:
        for cm in reversed(sessions):
            cm.__exit__(None, None, None)


def test_connections_of_terminated_backends_are_replaced_at_checkout(db: Database) -> None:
    assert not db.writer.pool._pre_ping
    _hold_connections(db, 4)
    pooled = db.writer.pool.checkedin()  # type: ignore[attr-defined]
    assert pooled >= 4
    with db.write() as s:
        killed = s.connection().execute(sa.text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar_one()
    assert killed >= pooled - 1
    # the one that ran the terminate survives; the others have exited, their sockets closed
    wait_until(lambda: _backends(db) <= 1, 60, "the terminated backends to exit")
    for _ in range(pooled + 2):  # every pooled connection drawn once, none of them works
        with db.write() as s:
            assert s.connection().execute(sa.text("SELECT 1")).scalar_one() == 1
        with db.read() as s:
            assert s.connection().execute(sa.text("SELECT 2")).scalar_one() == 2
    _hold_connections(db, pooled)
