"""Server-wide secrets kept in the database, created on first use by whichever replica is
first. Never logged."""

from __future__ import annotations

import hashlib
import hmac
import secrets

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from broker.store.db import Database
from broker.store.tables import SERVER_SECRETS as SECRETS

_SECRET = sa.select(SECRETS).where(SECRETS.c.name == sa.bindparam("name"))


def server_secret(db: Database, name: str) -> bytes:
    with db.read() as s:
        row = s.connection().execute(_SECRET, {"name": name}).first()
    if row is not None:
        return bytes.fromhex(row.value)
    value = secrets.token_hex(32)
    try:
        with db.write() as s:
            s.connection().execute(sa.insert(SECRETS).values(name=name, value=value))
    except IntegrityError:
        return server_secret(db, name)  # another replica made it first
    return bytes.fromhex(value)


def progress_token(key: bytes, job_id: str, attempt: int) -> str:
    """The bearer token an attempt uses to report progress: derived, so a re-dispatch after a
    crash hands the same token to the adopted object."""
    return hmac.new(key, f"progress:{job_id}:{attempt}".encode(), hashlib.sha256).hexdigest()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
