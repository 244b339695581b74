"""Read-side repository functions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlmodel import Session

from broker.store.tables import JobEventRow, JobRow


def get_job(session: Session, job_id: str) -> JobRow | None:
    return session.get(JobRow, job_id)


def list_jobs(
    session: Session,
    *,
    team: str | None = None,
    states: Sequence[str] = (),
    limit: int = 50,
    before_id: str | None = None,
) -> list[JobRow]:
    """Newest first. `before_id` continues a previous page (ids sort by creation time)."""
    stmt = select(JobRow)
    if team is not None:
        stmt = stmt.where(JobRow.team == team)  # type: ignore[arg-type]
    if states:
        stmt = stmt.where(JobRow.state.in_(list(states)))  # type: ignore[attr-defined]
    if before_id is not None:
        stmt = stmt.where(JobRow.id < before_id)  # type: ignore[arg-type]
    stmt = stmt.order_by(JobRow.id.desc()).limit(limit)  # type: ignore[attr-defined]
    return list(session.execute(stmt).scalars())


def job_events(session: Session, job_id: str) -> list[JobEventRow]:
    stmt = (
        select(JobEventRow)
        .where(JobEventRow.job_id == job_id)  # type: ignore[arg-type]
        .order_by(JobEventRow.seq)  # type: ignore[arg-type]
    )
    return list(session.execute(stmt).scalars())
