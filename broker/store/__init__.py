"""Persistence: SQLite (WAL) embedded by default, PostgreSQL for production and replicas."""

from broker.domain.clock import utcnow
from broker.store import migrate as _migrate
from broker.store.db import Database, connect
from broker.store.tables import AttemptRow, JobEventRow, JobRow


def open_database(url: str, *, migrate: bool = True, sqlite_synchronous: str = "FULL") -> Database:
    """Open the database at `url` (`db.connect`) and, by default, migrate it to the newest
    schema. The opener does not know the migrations, so the two stay free of a circle."""
    db = connect(url, sqlite_synchronous=sqlite_synchronous)
    if migrate:
        _migrate.upgrade(db)
    return db


__all__ = ["AttemptRow", "Database", "JobEventRow", "JobRow", "open_database", "utcnow"]
