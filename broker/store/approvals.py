"""Approval decisions, as they are stored: the job event an admin's decision appended.

A decision is the event whose cause key is APPROVAL_KEY (unique per job in job_events, so a
job is decided once): to QUEUED with reason Approved, or to CANCELLED with ApprovalRefused.
Its actor and time say who decided and when; nothing else records it, so nothing can drift.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session

from broker.domain.reasons import Reason
from broker.domain.states import JobState
from broker.store.records import (
    EVENTS,
    JOBS,
    EventRecord,
    JobRecord,
    event_from_row,
    job_from_row,
    select_events,
    select_jobs,
)

APPROVAL_KEY = "approval"


def decisions(s: Session, job_ids: Sequence[str]) -> dict[str, EventRecord]:
    """The decision event of each of these jobs that has one."""
    if not job_ids:
        return {}
    stmt = select_events().where(EVENTS.c.job_id.in_(list(job_ids)),
                                 EVENTS.c.cause_key == APPROVAL_KEY)
    return {e.job_id: e for e in (event_from_row(r) for r in s.connection().execute(stmt))}


def approved(s: Session, job_ids: Sequence[str]) -> set[str]:
    """The jobs among `job_ids` an admin approved."""
    return {j for j, e in decisions(s, job_ids).items() if e.reason == Reason.Approved.value}


def awaiting(s: Session, team: str | None = None, limit: int = 500) -> list[JobRecord]:
    """Queued jobs that wait for a decision, oldest first (the hold phase gave them
    AwaitingApproval)."""
    stmt = select_jobs().where(JOBS.c.state == JobState.QUEUED.value,
                               JOBS.c.reason == Reason.AwaitingApproval.value)
    if team is not None:
        stmt = stmt.where(JOBS.c.team == team)
    stmt = stmt.order_by(JOBS.c.id).limit(limit)
    return [job_from_row(r) for r in s.connection().execute(stmt)]
