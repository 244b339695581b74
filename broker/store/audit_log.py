"""The audit log (table `audit_log`): staging records, linking them to its hash chain, reading
it, verifying it.

Each row stores `hash` = SHA-256 of the previous row's hash and of the row's own content
(`row_hash`); the first row's previous hash is GENESIS. Changing, inserting or removing a row
anywhere but at the end breaks the chain at that row, which `verify` names (`isthmus db
check`). Cutting rows off the end leaves a shorter valid chain: a copy of the last hash kept
elsewhere (an export) is what shows that.

A call's record is written in two steps. `stage` inserts it into `audit_staged` in the call's
own transaction, so it commits with what it records or not at all, and takes no lock: calls
of every replica no longer wait in one line for each other's commits. `link` then moves staged
records, oldest staged first, to the chain's end: it holds the chain's lock from reading the
tail to its transaction's commit (on PostgreSQL a transaction-scoped advisory lock; on SQLite
the write lock every write transaction holds already, BEGIN IMMEDIATE, broker/store/db.py),
so the chain stays linear with several linkers. `prev_hash` is unique besides, so two linkers
that skipped the lock could not fork it: one would fail. Each API process links what it staged
moments after its commit (broker/api/audit_linker.py); a pass links every staged record, so
what a process that died before linking left is linked by the next pass of any replica, and
by each server's start. The log's readers link first, so a call's record is listed as soon
as the call is answered. A staged record is refused UPDATE by a trigger; it can be
deleted (linking moves it so), and until it is linked (tens of milliseconds) the chain's
hashes do not cover it: a record deleted then leaves no trace in the chain.
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

from broker.logs import get_logger
from broker.store import batch
from broker.store.conflicts import on_conflict
from broker.store.db import Database
from broker.store.db_clock import clock
from broker.store.tables import AUDIT_LOG as AUDIT
from broker.store.tables import AUDIT_STAGED as STAGED

log = get_logger(__name__)

GENESIS = "0" * 64
ALLOWED, REFUSED = "allowed", "refused"
_PG_AUDIT_LOCK = 0x15_7A_0A  # advisory lock id of the chain's tail (migrate.py uses 0x157A05)
LINK_BATCH = 1000
"""Staged records a linking transaction moves at most."""


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


_STAGED_CONTENT = ("actor", "actor_team", "actor_admin", "action", "method", "route",
                   "target", "outcome", "status", "request_id", "detail_json")
"""What a call writes of its record (`stage`); the chain adds the number and the time."""
_CONTENT = ("seq", "at", *_STAGED_CONTENT)
"""What a chained row's hash covers."""


def row_hash(prev_hash: str, row: dict[str, Any]) -> str:
    """The chain's hash of a row: its previous hash and its content as canonical JSON."""
    content = {k: row[k] for k in _CONTENT}
    content["at"] = row["at"].isoformat()
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{prev_hash}\n{text}".encode()).hexdigest()


def _lock_tail(conn: sa.Connection) -> tuple[int, str]:
    """The chain's last number and hash, its lock held to the transaction's end."""
    if conn.dialect.name != "sqlite":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_AUDIT_LOCK})")
    # a statement of its own after the lock: its snapshot sees the tail the last holder wrote
    row = conn.execute(_TAIL).first()
    return (row[0], row[1]) if row is not None else (0, GENESIS)


_TAIL = sa.select(AUDIT.c.seq, AUDIT.c.hash).order_by(AUDIT.c.seq.desc()).limit(1)


@functools.cache
def _stage_statement(sqlite: bool) -> sa.Insert:
    # stamped by the database's clock, as every replica's records are
    return sa.insert(STAGED).values(at=clock(sqlite))


def stage(session: Session, entries: list[Entry]) -> None:
    """Write `entries` in the caller's transaction, stamped with the database's clock, for
    `link` to add to the chain: they commit with what they record, and take no lock that
    another call waits for."""
    if not entries:
        return
    session.connection().execute(_stage_statement(session.get_bind().dialect.name == "sqlite"),
                                 [_staged(e) for e in entries])


def _staged(e: Entry) -> dict[str, Any]:
    return {"actor": e.actor[:255], "actor_team": e.actor_team, "actor_admin": e.actor_admin,
            "action": e.action[:40], "method": e.method[:8], "route": e.route[:255],
            "target": e.target[:255], "outcome": e.outcome, "status": e.status,
            "request_id": e.request_id[:64],
            "detail_json": (json.dumps(e.detail, sort_keys=True, separators=(",", ":"))
                            if e.detail else None)}


def link(session: Session, limit: int = LINK_BATCH) -> int:
    """Move up to `limit` staged records, oldest staged first, to the chain's end in the
    caller's transaction (the chain's lock held until it ends); how many."""
    conn = session.connection()
    if conn.execute(_ANY_STAGED).first() is None:
        return 0  # nothing staged: the chain's lock is not taken
    seq, prev = _lock_tail(conn)
    staged = conn.execute(
        sa.select(STAGED).order_by(STAGED.c.id).limit(limit)).mappings().all()
    if not staged:
        return 0  # another linker moved them while this one waited for the lock
    rows = []
    for r in staged:
        seq += 1
        row: dict[str, Any] = {"seq": seq, "at": r["at"], **{k: r[k] for k in _STAGED_CONTENT}}
        row["prev_hash"] = prev
        row["hash"] = prev = row_hash(prev, row)
        rows.append(row)
    batch.execute_many(conn, _INSERT_LINKED, rows)  # one statement, in seq order
    conn.execute(sa.delete(STAGED).where(STAGED.c.id.in_([r["id"] for r in staged])))
    return len(rows)


_INSERT_LINKED = sa.insert(AUDIT)
_ANY_STAGED = sa.select(STAGED.c.id).order_by(STAGED.c.id).limit(1)  # the key's first entry


@on_conflict  # a deadlock victim links again: its aborted transaction moved nothing
def _link_batch(db: Database) -> int:
    with db.write() as s:
        return link(s)


def link_staged(db: Database) -> int:
    """Every staged record linked to the chain (in transactions of LINK_BATCH); how many."""
    total = 0
    while True:
        n = _link_batch(db)
        total += n
        if n < LINK_BATCH:
            return total


def link_before_reading(db: Database) -> None:
    """What is staged linked, before a read of the log: the records of the calls answered so
    far are then listed. A read with nothing staged writes nothing; a failed link is logged,
    and the read goes on with what is linked (the process's linker tries again)."""
    try:
        with db.read() as s:
            if s.connection().execute(_ANY_STAGED).first() is None:
                return
        link_staged(db)
    except Exception:
        log.exception("staged audit records not linked before a read of the log")


def staged_count(session: Session) -> int:
    """Records staged and not linked yet."""
    return int(session.connection().execute(
        sa.select(sa.func.count()).select_from(STAGED)).scalar_one())


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
