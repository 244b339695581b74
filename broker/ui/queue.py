"""The waiting jobs in admission order, one page at a time, for the dashboard's Queue page.

The order is the position the last admission cycle stored with each job's verdicts
(broker/control/admission.py saves it in the job's explanation): ordered jobs first by
position, then jobs in retry backoff (position 0) and jobs no cycle has considered yet, by id
(submission order).
The admission cycle refreshes stored positions of the first policies.eta.MAX_ESTIMATED jobs
only, so deeper positions are as of the cycle that last changed their verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.api.schemas import WaitOut
from broker.domain import JobState
from broker.store.attempts import EXPLANATIONS
from broker.store.records import JOBS, JobRecord, job_from_row, select_jobs

PAGE_SIZE = 50
MAX_PAGE = 1000
LAST = 2**31 - 1
"""The sort key of jobs without a position: after every position."""


@dataclass(frozen=True, slots=True)
class Waiting:
    job: JobRecord
    wait: WaitOut | None


POSITION = sa.literal_column("explanations.queue_position", sa.Integer)
"""The position inside the stored verdicts, computed by the database when the verdict is
written (revision 0011): no JSON is parsed to sort the queue."""


def _team(stmt: sa.Select[Any], team: str | None) -> sa.Select[Any]:
    return stmt if team is None else stmt.where(JOBS.c.team == team)


def count_waiting(s: Session, team: str | None) -> int:
    stmt = sa.select(sa.func.count()).select_from(JOBS).where(
        JOBS.c.state == JobState.QUEUED.value)
    return int(s.connection().execute(_team(stmt, team)).scalar_one())


def waiting_page(s: Session, team: str | None, page: int) -> list[Waiting]:
    """Page `page` (from 1) of the waiting jobs (of `team`, or all) in admission order.

    Two steps: the page's ids are sorted on (position, id) alone, so the database sorts
    small records however many jobs wait; then only those jobs' rows and verdicts are read."""
    conn = s.connection()
    # one key, the position read once per row: 0 (retry backoff) and none (never considered)
    # sort after every real position
    key = sa.func.coalesce(sa.func.nullif(POSITION, 0), LAST)
    order = (
        sa.select(JOBS.c.id)
        .select_from(JOBS.outerjoin(EXPLANATIONS, EXPLANATIONS.c.job_id == JOBS.c.id))
        .where(JOBS.c.state == JobState.QUEUED.value)
        .order_by(key, JOBS.c.id)
        .limit(PAGE_SIZE).offset((min(max(page, 1), MAX_PAGE) - 1) * PAGE_SIZE)
    )
    ids = list(conn.execute(_team(order, team)).scalars())
    if not ids:
        return []
    rows = conn.execute(
        select_jobs().add_columns(EXPLANATIONS.c.at, EXPLANATIONS.c.payload_json)
        .select_from(JOBS.outerjoin(EXPLANATIONS, EXPLANATIONS.c.job_id == JOBS.c.id))
        .where(JOBS.c.id.in_(ids))
    )
    found: dict[str, Waiting] = {}
    for row in rows:
        at, payload = row[-2], row[-1]  # after the job's columns
        wait = None
        if payload is not None:
            try:
                wait = WaitOut.of(at, payload)
            except (ValueError, TypeError):
                wait = None  # stored before estimates existed, or unreadable
        job = job_from_row(tuple(row)[:-2])
        found[job.id] = Waiting(job, wait)
    return [found[i] for i in ids if i in found]


def waiting_by_team(s: Session, team: str | None) -> dict[str, tuple[int, int]]:
    """(jobs, GPUs) waiting for admission per team: the queue depth on the overview."""
    stmt = (sa.select(JOBS.c.team, sa.func.count(), sa.func.sum(JOBS.c.total_gpus))
            .where(JOBS.c.state == JobState.QUEUED.value).group_by(JOBS.c.team))
    rows = s.connection().execute(_team(stmt, team))
    return {t: (int(n), int(g or 0)) for t, n, g in rows}
