"""/v1/jobs: submit, read, list, events, cancel."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import ValidationError
from sqlmodel import Session

from broker.api import audit_trail
from broker.api.auth import Principal, principal
from broker.api.group_commit import SubmitQueue
from broker.api.guards import DB_INT_MAX, idempotency_key
from broker.api.job_refs import JobRef
from broker.api.listing import decode_cursor, waits
from broker.api.problems import Problem, invalid_spec, problem_responses
from broker.api.queue_limits import check_queued
from broker.api.schemas import CheckpointOut, EventOut, JobOut, JobPage
from broker.config import IsthmusConfig
from broker.domain import JobState
from broker.domain.clock import utcnow
from broker.domain.ids import is_job_id
from broker.domain.spec import JobSpec
from broker.feasibility import request_problems
from broker.orchestration.dependency_refs import UnknownDependency, checked_dependencies
from broker.orchestration.rules import Outcome
from broker.orchestration.submission import IdempotencyConflict, Submission, cancel_job
from broker.orchestration.user_holds import NotQueued, hold_job, release_job
from broker.orchestration.user_requeue import NotRequeueable, requeue_job
from broker.store import attempts as att
from broker.store.concurrency import WAITING
from broker.store.db import Database
from broker.store.queries import get_job, job_events, list_jobs
from broker.store.records import JobRecord
from broker.views.budgets import read_budgets
from broker.views.team_queues import queue_text, read_queues
from policies.explain import Explanation

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


def _db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def _config(request: Request) -> IsthmusConfig:
    cfg: IsthmusConfig = request.app.state.config
    return cfg


def _not_found(job_id: str) -> Problem:
    return Problem(404, "job-not-found", "Job not found", f"no job with id '{job_id}'")


def _visible_job(db: Database, job_id: str, caller: Principal) -> JobRecord:
    if not is_job_id(job_id):
        raise _not_found(job_id)
    with db.read() as s:
        return _visible_in(s, job_id, caller)


def _visible_in(s: Session, job_id: str, caller: Principal) -> JobRecord:
    """`_visible_job` in the caller's read transaction (a route that reads more of the job
    reads it all in one: each transaction costs more than a statement)."""
    if not is_job_id(job_id):
        raise _not_found(job_id)
    job = get_job(s, job_id)
    # Another team's job is reported as missing, so ids do not leak across teams.
    if job is None or not caller.can_see(job.team):
        raise _not_found(job_id)
    audit_trail.about(f"job:{job.id}")
    audit_trail.read_of(caller, job.team, f"job:{job.id}")
    return job


def _spec_from_body(body: bytes, content_type: str) -> JobSpec:
    media = content_type.split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise Problem(
            415, "unsupported-media-type", "Unsupported content type",
            f"send the job spec as application/json, not '{media or 'nothing'}'",
            [{"field": "Content-Type", "message": "must be application/json"}],
        )
    try:
        return JobSpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_spec(exc) from None


async def checked_spec(request: Request, caller: Caller) -> JobSpec:
    """The request's job spec, parsed and checked against the configuration and the caller's
    team (422, or 403 for another team's spec): shared by submit and plan."""
    spec = _spec_from_body(await request.body(), request.headers.get("content-type", ""))
    return allowed_spec(request, caller, spec)


def allowed_spec(request: Request, caller: Caller, spec: JobSpec) -> JobSpec:
    """`spec` if the configuration and the caller's team allow it: else 422, or 403 for
    another team's spec."""
    problems = request_problems(
        _config(request), spec, None if caller.is_admin else caller.team
    )
    if problems:
        status = 403 if any(p.forbidden for p in problems) else 422
        raise Problem(
            status, "invalid-spec" if status == 422 else "forbidden-team",
            "Invalid job spec" if status == 422 else "Not your team",
            "; ".join(f"{p.field}: {p.message}" for p in problems),
            [{"field": p.field, "message": p.message} for p in problems],
        )
    return spec


def _with_dependencies(db: Database, spec: JobSpec) -> JobSpec:
    """The spec's dependencies as Isthmus ids of its team's jobs, or 422 naming the field."""
    try:
        with db.read() as s:
            return checked_dependencies(s, spec)
    except UnknownDependency as exc:
        raise Problem(
            422, "invalid-spec", "Invalid job spec",
            f"{exc.field}: Job dependency problem: {exc}",
            [{"field": exc.field, "message": f"Job dependency problem: {exc}; name a job of "
              "your team by its id or number"}],
        ) from None


SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}}},
    }
}


@router.post(
    "", status_code=201, response_model=JobOut, openapi_extra=SPEC_BODY,
    responses={
        200: {"model": JobOut, "description": "replay of an idempotent submission"},
        **problem_responses(400, 403, 409, 413, 415, 429),
    },
)
async def submit(
    request: Request,
    caller: Caller,
    key: Annotated[str | None, Depends(idempotency_key)],
) -> Response:
    spec = await checked_spec(request, caller)
    return await submit_checked(request, caller, spec, key)


async def submit_checked(request: Request, caller: Caller, spec: JobSpec,
                         key: str | None) -> Response:
    """A checked spec submitted as POST /v1/jobs does it: its dependencies resolved, the
    queued-job limits checked, group-committed; 201 with the job (200: an idempotent
    replay)."""
    if spec.scheduling is not None and spec.scheduling.dependencies:
        spec = await asyncio.to_thread(_with_dependencies, _db(request), spec)
    await check_queued(_db(request), _config(request), spec.team, caller.name, key=key)
    queue: SubmitQueue = request.app.state.submit_queue
    try:
        result = await queue.submit(Submission(spec, caller.name, key),
                                    audit_trail.in_commit(request.scope))
    except IdempotencyConflict as exc:
        raise Problem(
            409, "idempotency-key-reused", "Idempotency key reused", str(exc),
            [{"field": "Idempotency-Key", "message": "use a new key for a different job"}],
        ) from None
    headers = {"Location": f"/v1/jobs/{result.job.id}"}
    if not result.created:
        headers["Idempotent-Replayed"] = "true"
    # Serialised here once; returning a model would make FastAPI validate it a second time.
    return Response(
        JobOut.of(result.job).model_dump_json(), status_code=201 if result.created else 200,
        headers=headers, media_type="application/json",
    )


@router.get("/{job_id}", response_model=JobOut, responses=problem_responses(404))
def get(job_id: JobRef, request: Request, caller: Caller) -> Response:
    return _json(job_out(job_id, request, caller))


def job_out(job_id: str, request: Request, caller: Principal) -> JobOut:
    """The job `get` answers (the dashboard's job pages show it)."""
    with _db(request).read() as s:  # one read transaction for all of it
        job = _visible_in(s, job_id, caller)
        out = JobOut.of(job, waits(s, [job]).get(job.id))
        ckpt = att.last_checkpoint(s, job_id)
    if ckpt is not None:
        out.last_checkpoint = CheckpointOut(attempt=ckpt.attempt, path=ckpt.path,
                                            step=ckpt.step, at=ckpt.at)
    return out


def _json(out: JobOut | JobPage) -> Response:
    """`out` serialised once (FastAPI would validate a returned model against the route's
    response model again before serialising it; the model documents the answer)."""
    return Response(out.model_dump_json(), media_type="application/json")


@router.get("", response_model=JobPage, responses=problem_responses(403))
def list_(
    request: Request,
    caller: Caller,
    team: str | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> Response:
    return _json(page(request, caller, team, state, limit, cursor))


def page(request: Request, caller: Caller, team: str | None, state: list[JobState] | None,
         limit: int, cursor: str | None) -> JobPage:
    """The page `list_` answers (the HPC listing adds each job's run to it; the dashboard's
    jobs page shows it)."""
    if not caller.is_admin:
        if team is not None and team != caller.team:
            raise Problem(
                403, "forbidden-team", "Not your team",
                f"team: your token can list only team '{caller.team}'",
                [{"field": "team", "message": f"must be '{caller.team}' or omitted"}],
            )
        team = caller.team
    audit_trail.read_of(caller, team)
    before = decode_cursor(cursor) if cursor else None
    with _db(request).read() as s:  # the page and its waits in one read transaction
        rows = list_jobs(
            s, team=team, states=[st.value for st in state or []], limit=limit + 1,
            before_id=before,
        )
        more = len(rows) > limit
        rows = rows[:limit]
        waiting = waits(s, rows)
    nxt = base64.urlsafe_b64encode(rows[-1].id.encode()).decode().rstrip("=") if more else None
    return JobPage(items=[JobOut.of(r, waiting.get(r.id)) for r in rows], next_cursor=nxt)


@router.get(
    "/{job_id}/events", response_model=list[EventOut], responses=problem_responses(404)
)
def events(job_id: JobRef, request: Request, caller: Caller) -> list[EventOut]:
    with _db(request).read() as s:
        _visible_in(s, job_id, caller)
        return [EventOut.of(e) for e in job_events(s, job_id)]


@router.post(
    "/{job_id}/cancel", response_model=JobOut, responses=problem_responses(404, 409)
)
def cancel(job_id: JobRef, request: Request, caller: Caller) -> Response:
    db = _db(request)
    _visible_job(db, job_id, caller)
    result = cancel_job(db, job_id, caller.name, caller.is_admin)
    if result.outcome in (Outcome.REJECT, Outcome.ABORT):
        raise Problem(
            409, "not-cancellable", "Job cannot be cancelled",
            f"job {job_id} is {result.job.state}; only a job that has not ended can be cancelled",
        )
    return _json(JobOut.of(result.job))


@router.post("/{job_id}/hold", response_model=JobOut, responses=problem_responses(404, 409))
def hold(job_id: JobRef, request: Request, caller: Caller) -> JobOut:
    """Keep a queued job out of admission until released (``scontrol hold``): it waits
    with JobHeldUser. 409 for a job that is not queued (Slurm holds only pending jobs)."""
    return _held(job_id, request, caller, hold_job)


@router.post("/{job_id}/release", response_model=JobOut,
             responses=problem_responses(404, 409))
def release(job_id: JobRef, request: Request, caller: Caller) -> JobOut:
    """Let a held job go back to admission (``scontrol release``)."""
    return _held(job_id, request, caller, release_job)


@router.post("/{job_id}/requeue", response_model=JobOut, status_code=202,
             responses=problem_responses(404, 409))
def requeue(job_id: JobRef, request: Request, caller: Caller, hold: bool = False) -> JobOut:
    """Stop the job's current attempt and put it back in the queue under the same id
    (``scontrol requeue``; ``hold=true``: ``scontrol requeuehold``, it then waits held until
    released). Accepted here, carried out by the next admission cycle: the attempt gets the
    job's stop signal and grace, the job goes RETRYING -> QUEUED with reason Requeued (not a
    failure, not counted by the retry policy). 409 for a job that is not admitted or running
    (a waiting job has nothing to stop; an ended job stays ended: submit it again)."""
    db = _db(request)
    _visible_job(db, job_id, caller)
    try:
        job = requeue_job(db, job_id, caller.name, hold)
    except NotRequeueable as exc:
        raise Problem(409, "not-requeueable", "Job cannot be requeued", str(exc)) from None
    wake = request.app.state.wake_admission
    if wake is not None:
        wake()  # the cycle carries requeues out
    return JobOut.of(job)


def _held(job_id: str, request: Request, caller: Principal,
          change: Callable[[Database, str, str], JobRecord]) -> JobOut:
    db = _db(request)
    _visible_job(db, job_id, caller)
    try:
        change(db, job_id, caller.name)
    except NotQueued as exc:
        raise Problem(409, "not-queued", "Job is not queued", str(exc)) from None
    with db.read() as s:
        job = get_job(s, job_id)
    assert job is not None
    return JobOut.of(job)


@router.get("/{job_id}/explain", responses=problem_responses(404))
def explain(job_id: JobRef, request: Request, caller: Caller) -> dict[str, object]:
    """Why the job waits (or where it was placed): the latest admission verdicts per pool,
    ordered, with the most severe reason; `text` is the same as `isthmus explain` prints it
    (rendered here, so the CLI needs none of the policy models)."""
    db = _db(request)
    with db.read() as s:  # the job and its verdicts in one read transaction
        job = _visible_in(s, job_id, caller)
        stored = att.get_explanation(s, job_id)
    # the GPU-hour budgets the job counts against: its team's and its submitter's
    budgets = [b for b in read_budgets(request.app.state.config, db, job.team,
                                       request.app.state.period_clock)
               if b.user is None or b.user == job.submitted_by]
    budget_text = "".join(
        f"\nbudget {b.budget}: {b.used_gpu_hours:.1f} of {b.gpu_hours:g} GPU-hours used "
        f"({b.fraction:.0%}, {b.state}; enforce {b.enforce}; renews {b.renews_at:%Y-%m-%d %H:%M}Z)"
        for b in budgets)
    team = request.app.state.config.team(job.team)
    if team is not None and team.splits_quota and job.state in WAITING:
        text = queue_text(read_queues(request.app.state.config, db, job.team), job.queue)
        budget_text += "\n" + text if text else ""
    lines = [b.model_dump(mode="json") for b in budgets]
    # as given: what the job hands its backend beyond the spec (the team's escape hatch);
    # `isthmus explain` prints it from `native` before the verdicts
    native = JobSpec.model_validate_json(job.spec_json).native
    if stored is None:
        return {
            "job_id": job_id, "state": job.state, "reason": job.reason,
            "message": job.message, "considered_at": None, "explanation": None,
            "text": budget_text.lstrip("\n") or None, "budgets": lines,
            "native": native.model_dump(mode="json") if native else None,
        }
    at, payload = stored
    return {
        "job_id": job_id, "state": job.state, "reason": job.reason, "message": job.message,
        "considered_at": at.isoformat(), "explanation": json.loads(payload),
        "text": Explanation.model_validate_json(payload).to_text() + budget_text,
        "budgets": lines, "native": native.model_dump(mode="json") if native else None,
    }


@router.get("/{job_id}/attempts", responses=problem_responses(404))
def attempts(job_id: JobRef, request: Request, caller: Caller) -> list[dict[str, object]]:
    """Every attempt with its immutable run snapshot, placement and backend object."""
    db = _db(request)
    _visible_job(db, job_id, caller)
    with db.read() as s:
        rows = att.attempts_of(s, job_id)
    return [
        {
            "number": a.number, "backend": a.backend, "pool": a.pool, "flavor": a.flavor,
            "backend_name": a.backend_name, "backend_id": a.backend_id, "dispatch": a.dispatch,
            "phase": a.phase, "created_at": a.created_at.isoformat(),
            "started_at": a.started_at.isoformat() if a.started_at else None,
            "ended_at": a.ended_at.isoformat() if a.ended_at else None,
            "failure": a.failure, "preempted": a.preempted, "last_step": a.last_step,
            "checkpoint": None if a.checkpoint_path is None else {
                "path": a.checkpoint_path, "step": a.checkpoint_step,
                "at": a.checkpoint_at.isoformat() if a.checkpoint_at else None},
            "snapshot": json.loads(a.snapshot_json),
        }
        for a in rows
    ]


def _visible_attempt(db: Database, job_id: str, number: int,
                     caller: Principal) -> att.AttemptRecord:
    """The attempt of a job the caller may see, or 404 (the job's, then the attempt's)."""
    _visible_job(db, job_id, caller)
    with db.read() as s:
        a = att.get_attempt(s, job_id, number)
    if a is None:
        raise Problem(404, "attempt-not-found", "Attempt not found",
                      f"job {job_id} has no attempt {number}")
    return a


@router.get(
    "/{job_id}/attempts/{number}/render", response_class=Response,
    responses=problem_responses(404),
)
def render(
    job_id: JobRef,
    number: Annotated[int, Path(ge=1, le=DB_INT_MAX, description="attempt number, from 1")],
    request: Request,
    caller: Caller,
) -> Response:
    """The exact batch script (Slurm) or manifests (Kubernetes) the attempt was created with."""
    a = _visible_attempt(_db(request), job_id, number, caller)
    if a.rendered is None:
        why = (f"attempt {number} has no backend object yet (dispatch: {a.dispatch})"
               if a.dispatch != att.CREATED else
               f"attempt {number} was created on {a.backend}, which sends no script or "
               f"manifest (a simulated backend): there is nothing to show")
        raise Problem(404, "not-rendered", "Nothing rendered", why)
    return Response(a.rendered, media_type="text/plain; charset=utf-8")


@router.get("/{job_id}/attempts/{number}/snapshot", responses=problem_responses(404))
def snapshot(
    job_id: JobRef,
    number: Annotated[int, Path(ge=1, le=DB_INT_MAX, description="attempt number, from 1")],
    request: Request,
    caller: Caller,
) -> dict[str, object]:
    """What reproducing the attempt needs: its immutable run snapshot (spec, spec hash, code
    and data versions, placement) and what it ran with, resolved once when its ranks started
    (image digest, GPU models, nodes, entrypoint hash; null until then)."""
    a = _visible_attempt(_db(request), job_id, number, caller)
    return {
        "job_id": job_id, "attempt": number, "backend_name": a.backend_name,
        "backend_id": a.backend_id, "created_at": a.created_at.isoformat(),
        "snapshot": json.loads(a.snapshot_json),
        "resolved": json.loads(a.resolved_json) if a.resolved_json else None,
    }


@router.get("/{job_id}/timeline", responses=problem_responses(404))
def timeline(job_id: JobRef, request: Request, caller: Caller) -> dict[str, object]:
    """Per attempt, the phases from queueing to the end (queued, dispatch, scheduling, init,
    warm-up to the first useful step, running) with start, end and seconds (broker/timeline.py)."""
    from broker.timeline import FactMark, build

    db = _db(request)
    job = _visible_job(db, job_id, caller)
    f = att.FACTS
    with db.read() as s:
        evs = job_events(s, job_id)
        rows = att.attempts_of(s, job_id)
        facts = [
            FactMark(r.attempt, r.phase, r.observed_at)
            for r in s.connection().execute(
                sa.select(f.c.attempt, f.c.phase, f.c.observed_at)
                .where(f.c.job_id == job_id, f.c.attempt.is_not(None))
            )
        ]
    now = utcnow()
    return {
        "job_id": job_id, "state": job.state, "reason": job.reason, "now": now.isoformat(),
        "first_useful_work_at": (job.first_useful_work_at.isoformat()
                                 if job.first_useful_work_at else None),
        "attempts": [
            {
                "number": t.number, "pool": t.pool, "outcome": t.outcome,
                "ended_at": t.ended_at.isoformat() if t.ended_at else None,
                "phases": [
                    {"name": p.name, "start": p.start.isoformat(),
                     "end": p.end.isoformat() if p.end else None,
                     "seconds": round(p.seconds(now), 3), "note": p.note}
                    for p in t.phases
                ],
            }
            for t in build(evs, rows, facts, job.first_useful_work_at)
        ],
    }


@router.get("/{job_id}/logs", responses=problem_responses(404, 503))
def logs(
    job_id: JobRef,
    request: Request,
    caller: Caller,
    attempt: Annotated[int | None, Query(ge=1, le=DB_INT_MAX,
                                         description="attempt number (default: the last)")] = None,
    rank: Annotated[int | None, Query(ge=0, le=65535, description="one rank only")] = None,
    tail: Annotated[int | None, Query(ge=0, le=100_000,
                                      description="last lines of each rank")] = None,
) -> dict[str, object]:
    """The output of each rank of an attempt, read through its backend: Slurm's output file,
    each Kubernetes pod's log, the simulator's synthetic log."""
    from backends.base import BackendUnavailable

    db = _db(request)
    _visible_job(db, job_id, caller)
    with db.read() as s:
        rows = att.attempts_of(s, job_id)
    if not rows:
        raise Problem(404, "attempt-not-found", "No attempt yet",
                      f"job {job_id} has not been admitted yet: no attempt, no logs")
    a = rows[-1] if attempt is None else next((r for r in rows if r.number == attempt), None)
    if a is None:
        raise Problem(404, "attempt-not-found", "Attempt not found",
                      f"job {job_id} has no attempt {attempt}")
    if a.dispatch != att.CREATED:
        raise Problem(404, "no-backend-object", "No backend object",
                      f"attempt {a.number} has no backend object (dispatch: {a.dispatch}): "
                      "nothing ran, so there are no logs")
    runtime = request.app.state.runtime
    if runtime is None or a.backend not in runtime.plane.backends:
        raise Problem(503, "backend-not-reachable", "Backend not reachable from here",
                      f"this server reaches no backend '{a.backend}' (it runs with "
                      "--no-control, or the backend is no longer configured)")
    reader = getattr(runtime.plane.gate(a.backend), "logs", None)
    if reader is None:
        raise Problem(503, "logs-unsupported", "Backend serves no logs",
                      f"backend {a.backend} cannot serve logs")
    try:
        got = reader(a.backend_name, rank, tail)
    except BackendUnavailable as exc:
        raise Problem(503, "backend-unavailable", "Backend unavailable", str(exc)) from None
    return {
        "job_id": job_id, "attempt": a.number, "backend": a.backend,
        "backend_name": a.backend_name,
        "ranks": [{"rank": x.rank, "source": x.source, "note": x.note, "text": x.text}
                  for x in got],
        "note": "" if got else f"backend {a.backend} no longer knows {a.backend_name}",
    }
