"""The decision log in the store: admission cycles and the per-job decisions logged with them.

Reads page newest first by id; pruning deletes whole cycles older than a cut-off, oldest
first, in bounded batches (each batch its own short transaction), with their decisions. The
`explanations` table (a job's current verdicts) is never touched here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.store import batch
from broker.store.attempts import CYCLES
from broker.store.db import Database
from broker.store.tables import DECISIONS as DECISIONS  # named here for its callers


@dataclass(frozen=True, slots=True)
class LoggedDecision:
    job_id: str
    team: str
    admitted: bool
    reason: str
    digest: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class CycleRecord:
    id: int
    at: datetime
    leader_epoch: int
    inputs_digest: str
    record_json: str
    repeats: int
    last_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobDecisionRecord:
    cycle_id: int
    at: datetime
    inputs_digest: str
    admitted: bool
    reason: str
    payload_json: str


_INSERT_DECISION = sa.insert(DECISIONS)


def insert_decisions(session: Session, cycle_id: int, rows: Sequence[LoggedDecision]) -> None:
    """A cycle's decisions, one statement (broker.store.batch's plain path: on PostgreSQL its
    rows as one JSON array, not one insert per job)."""
    if not rows:
        return
    batch.execute_many(session.connection(), _INSERT_DECISION, [
        {"cycle_id": cycle_id, "job_id": r.job_id, "team": r.team, "admitted": r.admitted,
         "reason": r.reason, "digest": r.digest, "payload_json": r.payload_json}
        for r in rows
    ])


def cycles_page(session: Session, limit: int, before_id: int | None = None) -> list[CycleRecord]:
    """Cycles newest first; `before_id`: only older ones (the next page)."""
    stmt = sa.select(CYCLES.c.id, CYCLES.c.at, CYCLES.c.leader_epoch, CYCLES.c.inputs_digest,
                     CYCLES.c.record_json, CYCLES.c.repeats, CYCLES.c.last_at)
    if before_id is not None:
        stmt = stmt.where(CYCLES.c.id < before_id)
    rows = session.connection().execute(stmt.order_by(CYCLES.c.id.desc()).limit(limit))
    return [CycleRecord(*r) for r in rows]


def logged_counts(session: Session, cycle_ids: Sequence[int]) -> dict[int, int]:
    """Decisions logged per cycle."""
    if not cycle_ids:
        return {}
    rows = session.connection().execute(
        sa.select(DECISIONS.c.cycle_id, sa.func.count())
        .where(DECISIONS.c.cycle_id.in_(list(cycle_ids)))
        .group_by(DECISIONS.c.cycle_id)
    )
    return {int(c): int(n) for c, n in rows}


def job_decisions(
    session: Session, job_id: str, limit: int, before_cycle: int | None = None
) -> list[JobDecisionRecord]:
    """A job's logged decisions, newest cycle first."""
    stmt = (
        sa.select(DECISIONS.c.cycle_id, CYCLES.c.at, CYCLES.c.inputs_digest,
                  DECISIONS.c.admitted, DECISIONS.c.reason, DECISIONS.c.payload_json)
        .select_from(DECISIONS.join(CYCLES, CYCLES.c.id == DECISIONS.c.cycle_id))
        .where(DECISIONS.c.job_id == job_id)
    )
    if before_cycle is not None:
        stmt = stmt.where(DECISIONS.c.cycle_id < before_cycle)
    rows = session.connection().execute(stmt.order_by(DECISIONS.c.cycle_id.desc()).limit(limit))
    return [JobDecisionRecord(*r) for r in rows]


def next_logged_cycle(session: Session, job_id: str, after: int) -> int | None:
    """The first cycle after `after` that logged a decision of the job."""
    return session.connection().execute(
        sa.select(sa.func.min(DECISIONS.c.cycle_id))
        .where(DECISIONS.c.job_id == job_id, DECISIONS.c.cycle_id > after)
    ).scalar_one_or_none()


def cycles_between(
    session: Session, first: int, last: int | None, until: datetime | None = None
) -> int:
    """Cycles with first <= id < last (None: no bound) stored before `until` (None: any)."""
    stmt = sa.select(sa.func.count()).select_from(CYCLES).where(CYCLES.c.id >= first)
    if last is not None:
        stmt = stmt.where(CYCLES.c.id < last)
    if until is not None:
        stmt = stmt.where(CYCLES.c.at < until)
    return int(session.connection().execute(stmt).scalar_one())


def prune(db: Database, before: datetime, batch: int, max_batches: int) -> int:
    """Delete the cycles stored before `before` and their decisions, oldest first, `batch`
    cycles per transaction, at most `max_batches` transactions; the cycles deleted."""
    deleted = 0
    for _ in range(max_batches):
        with db.write() as s:
            conn = s.connection()
            ids = list(conn.execute(
                sa.select(CYCLES.c.id).where(CYCLES.c.at < before)
                .order_by(CYCLES.c.id).limit(batch)
            ).scalars())
            if not ids:
                break
            conn.execute(sa.delete(DECISIONS).where(DECISIONS.c.cycle_id.in_(ids)))
            conn.execute(sa.delete(CYCLES).where(CYCLES.c.id.in_(ids)))
        deleted += len(ids)
        if len(ids) < batch:
            break
    return deleted
