"""Requests to requeue a job's current attempt (the job_requeues table): scontrol requeue and
requeuehold. The API writes one under the job's lock; the admission cycle carries it out
(broker.control.user_requeue) and deletes it in the transaction that requeues the job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.tables import JOB_REQUEUES as REQUEUES


@dataclass(frozen=True, slots=True)
class RequeueRequest:
    job_id: str
    attempt: int
    requested_by: str
    hold: bool
    requested_at: datetime


def ask(session: Session, req: RequeueRequest) -> None:
    """Record the request, replacing an earlier one of the job (the latest asker and hold
    choice win, as a second scontrol requeue of a job being requeued changes nothing else)."""
    conn = session.connection()
    conn.execute(sa.delete(REQUEUES).where(REQUEUES.c.job_id == req.job_id))
    conn.execute(sa.insert(REQUEUES).values(
        job_id=req.job_id, attempt=req.attempt, requested_by=req.requested_by,
        hold=req.hold, requested_at=req.requested_at))


def pending(session: Session) -> list[RequeueRequest]:
    """Every request not carried out yet, oldest first (the table is empty but for the
    moments between a request and the next admission cycle)."""
    rows = session.connection().execute(
        sa.select(REQUEUES.c.job_id, REQUEUES.c.attempt, REQUEUES.c.requested_by,
                  REQUEUES.c.hold, REQUEUES.c.requested_at)
        .order_by(REQUEUES.c.requested_at, REQUEUES.c.job_id))
    return [RequeueRequest(*r) for r in rows]


def drop(session: Session, job_id: str) -> None:
    session.connection().execute(sa.delete(REQUEUES).where(REQUEUES.c.job_id == job_id))
