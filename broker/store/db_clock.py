"""The database server's clock: what leases expire by and GPU-hour budget periods roll over by,
so that every replica agrees whatever its host's clock says."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa


def db_now(conn: sa.Connection) -> datetime:
    """The database server's clock, in UTC (PostgreSQL: clock_timestamp(), the time of the
    call rather than of the transaction's start; SQLite: its 'now', the host's clock)."""
    if conn.dialect.name == "sqlite":
        text = conn.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").scalar()
        return datetime.fromisoformat(str(text)).replace(tzinfo=UTC)
    value = conn.execute(sa.select(sa.func.clock_timestamp())).scalar()
    assert isinstance(value, datetime)
    return value.astimezone(UTC)
