"""The audit log (table `audit_log`): appending to its hash chain, reading it, verifying it.

Each row stores `hash` = SHA-256 of the previous row's hash and of the row's own content
(`row_hash`); the first row's previous hash is GENESIS. Changing, inserting or removing a row
anywhere but at the end breaks the chain at that row, which `verify` names (`isthmus db
check`). Cutting rows off the end leaves a shorter valid chain: a copy of the last hash kept
elsewhere (an export) is what shows that.

The chain stays linear with several writers (API workers and replicas) because `append` holds
the chain's lock from reading the tail to its transaction's commit: on PostgreSQL a
transaction-scoped advisory lock; on SQLite the database write lock every write transaction
holds already (BEGIN IMMEDIATE, broker/store/db.py). Callers append as the last step of their
transaction, so the lock covers only the tail read, the insert and the commit. `prev_hash` is
unique besides, so two writers that skipped the lock could not fork the chain: one would fail.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.db_clock import clock, clock_value
from broker.store.tables import AUDIT_LOG as AUDIT

GENESIS = "0" * 64
ALLOWED, REFUSED = "allowed", "refused"
_PG_AUDIT_LOCK = 0x15_7A_0A  # advisory lock id of the chain's tail (migrate.py uses 0x157A05)


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing to record; the chain adds its number, time and hashes."""

    actor: str  # the token's or user's name; "(unauthenticated)" when none was valid
    actor_team: str | None
    actor_admin: bool
    action: str  # job.cancel, pool.drain, read, ... (broker/api/audit_trail.py)
    method: str
    route: str  # the route's template: /v1/jobs/{job_id}/cancel
    target: str  # job:ID, pool:NAME, team:NAME, all-teams, ...
    outcome: str  # ALLOWED or REFUSED
    status: int  # the HTTP status answered
    request_id: str
    detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """A stored row."""

    seq: int
    at: datetime
    actor: str
    actor_team: str | None
    actor_admin: bool
    action: str
    method: str
    route: str
    target: str
    outcome: str
    status: int
    request_id: str
    detail_json: str | None
    prev_hash: str
    hash: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["at"] = self.at.isoformat()
        out["detail"] = json.loads(self.detail_json) if self.detail_json else None
        del out["detail_json"]
        return out


_CONTENT = ("seq", "at", "actor", "actor_team", "actor_admin", "action", "method", "route",
            "target", "outcome", "status", "request_id", "detail_json")


def row_hash(prev_hash: str, row: dict[str, Any]) -> str:
    """The chain's hash of a row: its previous hash and its content as canonical JSON."""
    content = {k: row[k] for k in _CONTENT}
    content["at"] = row["at"].isoformat()
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{prev_hash}\n{text}".encode()).hexdigest()


def _lock_tail(conn: sa.Connection) -> tuple[int, str, datetime]:
    """The chain's last number and hash, its lock held to the transaction's end, and the
    database's clock (read in the same statement: one round trip less under the lock)."""
    if conn.dialect.name != "sqlite":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_AUDIT_LOCK})")
    # a statement of its own after the lock: its snapshot sees the tail the last holder wrote
    seq, hash_, now = conn.execute(_tail_and_clock(conn.dialect.name == "sqlite")).one()
    return (seq or 0, hash_ or GENESIS, clock_value(now))


@functools.cache
def _tail_and_clock(sqlite: bool) -> sa.Select[Any]:
    last = sa.select(AUDIT.c.seq, AUDIT.c.hash).order_by(AUDIT.c.seq.desc()).limit(1).subquery()
    return sa.select(last.c.seq, last.c.hash, clock(sqlite).label("now")).select_from(
        sa.select(sa.literal(1).label("one")).subquery().outerjoin(last, sa.true()))


def append(session: Session, entries: list[Entry]) -> list[int]:
    """Write `entries` at the end of the chain in the caller's transaction (call it last: the
    chain's lock is held until that transaction ends); their numbers, in order."""
    if not entries:
        return []
    conn = session.connection()
    seq, prev, at = _lock_tail(conn)
    rows = []
    for e in entries:
        seq += 1
        row: dict[str, Any] = {
            "seq": seq, "at": at, "actor": e.actor[:255], "actor_team": e.actor_team,
            "actor_admin": e.actor_admin, "action": e.action[:40], "method": e.method[:8],
            "route": e.route[:255], "target": e.target[:255], "outcome": e.outcome,
            "status": e.status, "request_id": e.request_id[:64],
            "detail_json": (json.dumps(e.detail, sort_keys=True, separators=(",", ":"))
                            if e.detail else None),
        }
        row["prev_hash"] = prev
        row["hash"] = prev = row_hash(prev, row)
        rows.append(row)
    conn.execute(sa.insert(AUDIT), rows)
    return [r["seq"] for r in rows]


@dataclass(frozen=True, slots=True)
class Filters:
    actor: str | None = None
    action: str | None = None
    target: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive

    def where(self) -> list[sa.ColumnElement[bool]]:
        c = AUDIT.c
        out: list[sa.ColumnElement[bool]] = []
        if self.actor is not None:
            out.append(c.actor == self.actor)
        if self.action is not None:
            out.append(c.action == self.action)
        if self.target is not None:
            out.append(c.target == self.target)
        if self.since is not None:
            out.append(c.at >= self.since)
        if self.until is not None:
            out.append(c.at < self.until)
        return out


def _record(row: Any) -> Record:
    return Record(**{k: getattr(row, k) for k in Record.__dataclass_fields__})


def listing(session: Session, filters: Filters, limit: int,
            before: int | None = None) -> list[Record]:
    """Matching records, newest first, of numbers below `before` (the paging cursor)."""
    q = sa.select(AUDIT).where(*filters.where())
    if before is not None:
        q = q.where(AUDIT.c.seq < before)
    rows = session.connection().execute(q.order_by(AUDIT.c.seq.desc()).limit(limit))
    return [_record(r) for r in rows]


def oldest_first(session: Session, filters: Filters, after: int = 0,
                 limit: int = 1000) -> list[Record]:
    """Matching records of numbers above `after`, oldest first (the export's order)."""
    q = sa.select(AUDIT).where(AUDIT.c.seq > after, *filters.where())
    rows = session.connection().execute(q.order_by(AUDIT.c.seq).limit(limit))
    return [_record(r) for r in rows]


@dataclass(frozen=True, slots=True)
class Broken:
    """The first row at which the chain does not hold, and why."""

    seq: int
    problem: str

    def __str__(self) -> str:
        return f"audit row {self.seq}: {self.problem}"


@dataclass(frozen=True, slots=True)
class Verified:
    rows: int
    broken: Broken | None


def _walk(session: Session, batch: int) -> Iterator[Record]:
    after = 0
    while True:
        rows = oldest_first(session, Filters(), after, batch)
        if not rows:
            return
        yield from rows
        after = rows[-1].seq


def verify(session: Session, batch: int = 1000) -> Verified:
    """Walk the chain from its first row; the first row that was changed, inserted or follows
    a removed one (numbers run 1, 2, 3, ... with no gap)."""
    prev, expected, count = GENESIS, 1, 0
    for r in _walk(session, batch):
        count += 1
        if r.seq != expected:
            return Verified(count, Broken(r.seq, f"expected row {expected} before it: "
                                                 f"rows {expected}..{r.seq - 1} are missing"))
        if r.prev_hash != prev:  # the row before was rewritten whole, hash and all
            return Verified(count, Broken(r.seq - 1, f"its hash is not the one row {r.seq} "
                                                     "recorded (rewritten with a fresh hash, "
                                                     f"or row {r.seq}'s prev_hash changed)"))
        if row_hash(r.prev_hash, asdict(r)) != r.hash:
            return Verified(count, Broken(r.seq, "its content does not match its hash "
                                                 "(changed after it was written)"))
        prev, expected = r.hash, expected + 1
    return Verified(count, None)
