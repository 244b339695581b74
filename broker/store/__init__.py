"""Persistence: SQLite (WAL) embedded by default, PostgreSQL for production and replicas."""

from broker.store.db import Database, open_database
from broker.store.tables import AttemptRow, JobEventRow, JobRow, utcnow

__all__ = ["AttemptRow", "Database", "JobEventRow", "JobRow", "open_database", "utcnow"]
