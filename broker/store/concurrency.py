"""Counts behind the concurrency limits and the queues' fair sharing and shares: jobs and GPUs
held, jobs waiting, per team and user or per team and queue (and flavor).

Read from the jobs table (its state index): a job's `total_gpus` and `submitted_by` never
change, so the live rows are the truth and nothing is kept beside them to drift.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from broker.domain.states import HOLDING, JobState
from broker.store.records import JOBS
from broker.store.tables import ATTEMPTS

WAITING: tuple[str, ...] = tuple(s.value for s in (
    JobState.SUBMITTED, JobState.VALIDATING, JobState.QUEUED, JobState.RETRYING))
"""States counted as queued jobs: not ended and holding no GPUs."""


def held_by_user(s: Session) -> dict[tuple[str, str], tuple[int, int]]:
    """(jobs, GPUs) held (ADMITTED, PREPARING, RUNNING) per (team, user)."""
    stmt = (sa.select(JOBS.c.team, JOBS.c.submitted_by, sa.func.count(),
                      sa.func.coalesce(sa.func.sum(JOBS.c.total_gpus), 0))
            .where(JOBS.c.state.in_(sorted(st.value for st in HOLDING)))
            .group_by(JOBS.c.team, JOBS.c.submitted_by))
    return {(t, u): (int(n), int(g)) for t, u, n, g in s.connection().execute(stmt)}


def held_by_queue(s: Session) -> dict[tuple[str, str], int]:
    """GPUs held (ADMITTED, PREPARING, RUNNING) per (team, queue)."""
    stmt = (sa.select(JOBS.c.team, JOBS.c.queue,
                      sa.func.coalesce(sa.func.sum(JOBS.c.total_gpus), 0))
            .where(JOBS.c.state.in_(sorted(st.value for st in HOLDING)))
            .group_by(JOBS.c.team, JOBS.c.queue))
    return {(t, q): int(g) for t, q, g in s.connection().execute(stmt)}


def held_by_queue_flavor(s: Session, team: str | None = None
                         ) -> dict[tuple[str, str, str], int]:
    """GPUs held (ADMITTED, PREPARING, RUNNING) per (team, queue, flavor): the flavor is the
    job's current attempt's (its placement); `team`: that team's only."""
    current = sa.and_(ATTEMPTS.c.job_id == JOBS.c.id, ATTEMPTS.c.number == JOBS.c.attempt)
    stmt = (sa.select(JOBS.c.team, JOBS.c.queue, ATTEMPTS.c.flavor,
                      sa.func.coalesce(sa.func.sum(JOBS.c.total_gpus), 0))
            .select_from(JOBS.join(ATTEMPTS, current))
            .where(JOBS.c.state.in_(sorted(st.value for st in HOLDING)))
            .group_by(JOBS.c.team, JOBS.c.queue, ATTEMPTS.c.flavor))
    if team is not None:
        stmt = stmt.where(JOBS.c.team == team)
    return {(t, q, f): int(g) for t, q, f, g in s.connection().execute(stmt)}


def waiting_by_queue(s: Session, team: str | None = None) -> dict[tuple[str, str], int]:
    """Jobs waiting (WAITING states) per (team, queue); `team`: that team's only."""
    stmt = (sa.select(JOBS.c.team, JOBS.c.queue, sa.func.count())
            .where(JOBS.c.state.in_(WAITING)).group_by(JOBS.c.team, JOBS.c.queue))
    if team is not None:
        stmt = stmt.where(JOBS.c.team == team)
    return {(t, q): int(n) for t, q, n in s.connection().execute(stmt)}


def waiting_by_user(s: Session, team: str | None = None) -> dict[tuple[str, str], int]:
    """Jobs waiting (WAITING states) per (team, user); `team`: that team's only."""
    stmt = (sa.select(JOBS.c.team, JOBS.c.submitted_by, sa.func.count())
            .where(JOBS.c.state.in_(WAITING)).group_by(JOBS.c.team, JOBS.c.submitted_by))
    if team is not None:
        stmt = stmt.where(JOBS.c.team == team)
    return {(t, u): int(n) for t, u, n in s.connection().execute(stmt)}


def waiting_of(s: Session, team: str, user: str) -> tuple[int, int]:
    """(the team's, the user's) jobs waiting."""
    by_user = waiting_by_user(s, team)
    return sum(by_user.values()), by_user.get((team, user), 0)
