"""POST /v1/jobs/{id}/progress: training code reports its step with the per-attempt token it
finds in ISTHMUS_PROGRESS_TOKEN. The first report sets first_useful_work_at (time to useful
work). A report that names a checkpoint stores it on the attempt (path, step, time): the job's
next attempt resumes from the latest one (ISTHMUS_RESUME_FROM), preemption and waste count the
work lost since it. The token authenticates this one call for this one attempt, nothing else."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from broker.api.guards import DB_INT_MAX
from broker.api.problems import Problem, problem_responses
from broker.domain.clock import utcnow
from broker.domain.ids import is_job_id
from broker.domain.spec import WholeNumber
from broker.domain.text import Text
from broker.metrics import TIME_TO_USEFUL_WORK
from broker.store import attempts as att
from broker.store import records
from broker.store.conflicts import on_conflict
from broker.store.db import Database
from broker.store.secrets import digest

router = APIRouter(
    prefix="/v1/jobs", tags=["progress"], responses=problem_responses(400, 401, 404, 409, 413, 422)
)


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: WholeNumber = Field(ge=0, le=DB_INT_MAX)
    checkpoint: Text | None = Field(default=None, max_length=1024)


class ProgressAck(BaseModel):
    job_id: str
    attempt: int
    step: int
    first_useful_work: bool
    checkpoint: str | None = None


async def _bearer(
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> str:
    """The report's bearer token, or 401: a dependency, so it is asked for before the body is
    read and validated (an unauthenticated caller learns nothing of what a body must be).
    Async on purpose: a sync dependency would cost every report a worker-thread hop."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Problem(401, "unauthenticated", "Progress token required",
                      "send 'Authorization: Bearer $ISTHMUS_PROGRESS_TOKEN'",
                      headers={"WWW-Authenticate": 'Bearer realm="isthmus-progress"'})
    return authorization[7:].strip()


@router.post("/{job_id}/progress", response_model=ProgressAck)
def progress(
    job_id: str,
    token: Annotated[str, Depends(_bearer)],
    body: Progress,
    request: Request,
) -> ProgressAck:
    if not is_job_id(job_id):
        raise Problem(404, "job-not-found", "Job not found", f"no job with id '{job_id}'")
    db: Database = request.app.state.db
    now = utcnow()
    number, first = _record(db, job_id, digest(token), body, now)
    if first is not None:  # observed once the report committed: counted once
        team, created_at = first
        TIME_TO_USEFUL_WORK.labels(team).observe((now - created_at).total_seconds())
    return ProgressAck(job_id=job_id, attempt=number, step=body.step,
                       first_useful_work=first is not None,
                       checkpoint=body.checkpoint or None)


@on_conflict  # a deadlock victim is written again: its aborted transaction left nothing
def _record(db: Database, job_id: str, token_digest: str, body: Progress,
            now: datetime) -> tuple[int, tuple[str, datetime] | None]:
    """The report written: the attempt's number and, for the job's first report, the job's
    team and creation time (its time to useful work)."""
    with db.write() as s:
        if not body.checkpoint:
            # most reports: a step of a job already at work, one statement, no job row
            number = att.report_step(s, job_id, token_digest, body.step, now)
            if number is not None:
                return number, None
            # the job's first report: its first useful work (the job row locked), then the
            # step, the same one statement now that the job is at work (three in all)
            started = records.start_useful_work(s, job_id, token_digest, now)
            if started is not None:
                number = att.report_step(s, job_id, token_digest, body.step, now)
                if number is not None:
                    return number, started
                # a pass ended the attempt before the job's lock was ours: answered below
                # (409), which rolls back the first useful work set above
        # Lock order job row -> attempt row, as set_state and the reconciler take them:
        # updating the attempt first deadlocked against a reconcile pass on PostgreSQL.
        # A checkpoint waits for a pass ending the attempt, so it is not kept for an
        # attempt whose end (and the work it lost) was counted without it.
        job = records.lock_job(s, job_id)
        attempt = att.by_token_digest(s, job_id, token_digest) if job is not None else None
        if job is None or attempt is None:
            raise Problem(401, "unauthenticated", "Invalid progress token",
                          "the token does not belong to an attempt of this job")
        if attempt.ended_at is not None:
            raise Problem(409, "attempt-ended", "Attempt ended",
                          f"attempt {attempt.number} of job {job_id} has ended")
        values: dict[str, object] = {"last_step": body.step, "last_progress_at": now}
        if body.checkpoint:
            values.update(checkpoint_path=body.checkpoint, checkpoint_step=body.step,
                          checkpoint_at=now)
        att.update(s, job_id, attempt.number, **values)
        first = records.set_first_useful_work(s, job_id, now)
    return attempt.number, (job.team, job.created_at) if first else None
