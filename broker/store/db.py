"""Engines and sessions for SQLite (embedded default) and PostgreSQL (production).

SQLite: WAL, and write transactions start with BEGIN IMMEDIATE so that a job row read under
"lock" cannot be changed by another writer before commit (SQLite has no row locks; the
database write lock stands in for them). Reads use a second engine with deferred BEGIN so
they never wait for writers. PostgreSQL: one engine; row locks are SELECT ... FOR UPDATE.
"""

from __future__ import annotations

import contextlib
import re
import select
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlmodel import Session

from broker.store.pg_cursor import LazyDescriptionCursor

SUPPORTED = ("sqlite", "postgresql")


class DatabaseURLError(ValueError):
    pass


def masked(url: str) -> str:
    """`url` with its password (if any) replaced by ***: fit for messages and logs."""
    return re.sub(r"(://[^:/@]*:).*@", r"\1***@", url)


def normalise_url(url: str) -> str:
    """Accept postgres:// and postgresql:// and pin the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise DatabaseURLError(
            f"database URL '{masked(url)}' is not valid; use sqlite:///path/to/isthmus.db or "
            "postgresql://user@host:port/dbname"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in SUPPORTED:
        raise DatabaseURLError(
            f"database '{backend}' is not supported; use sqlite:///... or postgresql://..."
        )
    if backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _sqlite_engine(url: str, immediate: bool, synchronous: str) -> sa.Engine:
    path = make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        pool_size=8,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _closed_by_server(dbapi_conn: Any) -> bool:
    """Whether the server has closed this idle connection (backend terminated, server
    restarted): with no query in flight, anything to read on its socket is the server's
    farewell (a FATAL notice, the end of the stream). One poll(2) call, no round trip."""
    if getattr(dbapi_conn, "closed", False):
        return True
    try:
        fd = dbapi_conn.fileno()
    except Exception:  # the driver no longer has a socket
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def _postgres_engine(url: str) -> sa.Engine:
    """A pooled engine whose checkout replaces a connection the server closed, found without
    the round trip per transaction of `pool_pre_ping` (a SELECT before every checkout);
    connections are renewed after 30 minutes. A connection that dies while in use, or whose
    server's farewell has not arrived yet at checkout, fails that transaction, and SQLAlchemy
    then invalidates every older connection of the pool. Its cursors build `description` only
    when it is read (broker.store.pg_cursor)."""
    engine = sa.create_engine(url, pool_size=10, max_overflow=10, pool_recycle=1800,
                              connect_args={"cursor_factory": LazyDescriptionCursor})

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if _closed_by_server(dbapi_conn):
            raise sa.exc.DisconnectionError("the server closed this pooled connection")

    return engine


@dataclass
class Database:
    url: str
    writer: sa.Engine
    reader: sa.Engine
    # SQLite allows one writer at a time. Queueing writers of this process on a lock is fair
    # and immediate; leaving them to SQLite's busy handler makes them sleep and retry.
    _write_lock: threading.Lock | None = None

    @property
    def dialect(self) -> str:
        return self.writer.dialect.name

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on any exception."""
        if self._write_lock is None:
            with Session(self.writer, expire_on_commit=False) as session, session.begin():
                yield session
            return
        with (
            self._write_lock,
            Session(self.writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.reader, expire_on_commit=False) as session, session.begin():
            yield session

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read-only transaction whose statements all see one snapshot of the database, for
        checks that compare tables while writers commit (`isthmus db check`). SQLite's read
        transaction is one already (deferred BEGIN, WAL); on PostgreSQL `read` is READ
        COMMITTED, each statement seeing what committed before it: here REPEATABLE READ."""
        with Session(self.reader, expire_on_commit=False) as session, session.begin():
            if not self.is_sqlite:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ",
                                                      "postgresql_readonly": True})
            yield session

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()


def connect(url: str, *, sqlite_synchronous: str = "FULL") -> Database:
    """Open the database at `url` as it is; the caller migrates it (broker.store.migrate, or
    `broker.store.open_database`, which does both)."""
    url = normalise_url(url)
    if make_url(url).get_backend_name() == "sqlite":
        if sqlite_synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise DatabaseURLError("sqlite_synchronous must be OFF, NORMAL, FULL or EXTRA")
        writer = _sqlite_engine(url, immediate=True, synchronous=sqlite_synchronous)
        reader = _sqlite_engine(url, immediate=False, synchronous=sqlite_synchronous)
    else:
        writer = _postgres_engine(url)
        reader = writer
    lock = threading.Lock() if writer.dialect.name == "sqlite" else None
    return Database(url=url, writer=writer, reader=reader, _write_lock=lock)
