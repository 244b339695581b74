"""Users' holds on queued jobs (the job_holds table): scontrol hold / release, sbatch --hold."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.in_lists import in_chunks
from broker.store.tables import JOB_HOLDS as HOLDS


def held(session: Session, job_ids: Sequence[str] | None = None) -> dict[str, str]:
    """``{job_id: held_by}``: every held job, or those among ``job_ids``."""
    conn = session.connection()
    if job_ids is None:
        return {r.job_id: r.held_by for r in conn.execute(sa.select(HOLDS))}
    out: dict[str, str] = {}
    for chunk in in_chunks(list(job_ids)):
        for r in conn.execute(sa.select(HOLDS).where(HOLDS.c.job_id.in_(chunk))):
            out[r.job_id] = r.held_by
    return out


def hold(session: Session, job_id: str, by: str, at: datetime) -> bool:
    """Hold the job; False when it already was."""
    if held(session, [job_id]):
        return False
    session.connection().execute(sa.insert(HOLDS).values(job_id=job_id, held_by=by, held_at=at))
    return True


def release(session: Session, job_id: str) -> bool:
    """Release the job; False when it was not held."""
    done = session.connection().execute(sa.delete(HOLDS).where(HOLDS.c.job_id == job_id))
    return bool(done.rowcount)
