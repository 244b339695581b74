"""Versioned schema migrations (Alembic), applied at start-up under a lock."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from broker.store.db import Database

_SCRIPTS = Path(__file__).parent / "migrations"
_PG_MIGRATION_LOCK = 0x15_7A_05  # advisory lock id: replicas migrate one at a time


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    return cfg


def upgrade(db: Database, revision: str = "head") -> None:
    cfg = _config()
    with db.writer.begin() as conn:
        if not db.is_sqlite:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(db: Database, revision: str) -> None:
    """Back to `revision` (only the revisions that have a downgrade; the others raise)."""
    cfg = _config()
    with db.writer.begin() as conn:
        if not db.is_sqlite:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
