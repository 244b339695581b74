"""The database server's clock: what leases expire by and GPU-hour budget periods roll over by,
so that every replica agrees whatever its host's clock says."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa


def clock(sqlite: bool) -> sa.ColumnElement[Any]:
    """The clock as a column to select beside other values (read it with `clock_value`):
    PostgreSQL's clock_timestamp(), the time of the call rather than of the transaction's
    start; SQLite's 'now', the host's clock, as text."""
    if sqlite:
        return sa.func.strftime("%Y-%m-%d %H:%M:%f", "now")
    return sa.func.clock_timestamp()


def clock_value(value: object) -> datetime:
    """The clock's value read through `clock`, in UTC."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def db_now(conn: sa.Connection) -> datetime:
    """The database server's clock, in UTC (`clock`)."""
    return clock_value(conn.execute(sa.select(clock(conn.dialect.name == "sqlite"))).scalar())
