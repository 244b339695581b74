"""/v1/hpc: what the HPC drop-ins (isbatch, isqueue, ...) need besides the jobs API.

isbatch submits with one call, ``POST /v1/hpc/batch``: it sends the request it parsed, the
server maps it through its ``slurm_compat`` section (broker/orchestration/batch_submit.py)
and checks and submits each resulting spec exactly as ``POST /v1/jobs`` does (the spec, the
caller's team).
``isbatch --test-only`` reads the section (``GET /v1/hpc/slurm-compat``) and asks ``/v1/plan``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request

from broker.api import audit_trail, routes_jobs
from broker.api.auth import Principal, principal
from broker.api.group_commit import SubmitQueue
from broker.api.job_refs import JobRef
from broker.api.problems import Problem, problem_responses
from broker.api.queue_limits import check_queued
from broker.config import IsthmusConfig
from broker.domain.spec import JobSpec
from broker.domain.states import JobState
from broker.feasibility import request_problems
from broker.orchestration import batch_submit
from broker.orchestration.submission import Submission
from broker.orchestration.user_holds import NotQueued, hold_job
from broker.sbatch.compat import CompatError
from broker.sbatch.values import SbatchError
from broker.store import current_runs as runs
from broker.store import job_numbers
from broker.store.db import Database

router = APIRouter(prefix="/v1/hpc", tags=["hpc"], responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


@router.get("/slurm-compat", responses=problem_responses(404))
def slurm_compat(request: Request, caller: Caller) -> dict[str, Any]:
    """The ``slurm_compat`` section and who the caller is (the default account is the team),
    with the sbatch options each team the caller may submit for may pass to Slurm natively
    (``isbatch --test-only`` maps as the batch call does; the batch call decides)."""
    config: IsthmusConfig = request.app.state.config
    if config.slurm_compat is None:
        raise Problem(404, "no-slurm-compat", "sbatch requests are not configured",
                      "this broker has no slurm_compat section in its configuration; "
                      "ask the platform team to map partitions, accounts and qos")
    allowed = batch_submit.native_allowed(config)
    teams = [t.name for t in config.teams] if caller.is_admin else [caller.team or ""]
    return {
        "slurm_compat": config.slurm_compat.model_dump(mode="json"),
        "caller": {"name": caller.name, "team": caller.team, "admin": caller.is_admin},
        "partition_shapes": _partition_shapes(config),
        "native_slurm_options": {t: allowed(t) for t in teams if allowed(t)},
    }


def _partition_of(config: IsthmusConfig, spec: dict[str, Any],
                  run: dict[str, Any] | None) -> str | None:
    """squeue's PARTITION for a job: the sbatch partitions (slurm_compat) that offer the
    flavor it runs on, or while it waits the flavors it accepts, comma-joined as Slurm shows a
    job queued to several; None without a slurm_compat section or a partition that fits (the
    drop-ins then show the pool). isbatch's jobs carry the one they asked for."""
    compat = config.slurm_compat
    if compat is None:
        return None
    flavors = [run["flavor"]] if run and run.get("flavor") else list(spec.get("flavors") or [])
    names = [name for name, part in compat.partitions.items()
             if any(f in part.flavors for f in flavors)]
    return ",".join(sorted(names)) or None


def _partition_shapes(config: IsthmusConfig) -> dict[str, dict[str, Any]]:
    """What sinfo's ``%D`` and ``%G`` show of each sbatch partition: the nodes and the GPUs a
    node (``gpu:TYPE:N``, a type per flavor) of the pools it maps to, from their configured
    shapes (pools without one count no nodes)."""
    compat = config.slurm_compat
    assert compat is not None
    kinds = {b.name: b.serves_as.value for b in config.backends}
    type_of: dict[str, str] = {}
    for gpu_type, flavor in compat.gpu_types.items():
        type_of.setdefault(flavor, gpu_type)
    out: dict[str, dict[str, Any]] = {}
    for name, part in compat.partitions.items():
        nodes, gres = 0, []
        for flavor in part.flavors:
            pools = [p for p in config.pools if p.flavor == flavor and p.capacity is not None
                     and part.backend in ("any", kinds.get(p.backend))]
            if not pools:
                continue
            nodes += sum(p.capacity.nodes for p in pools if p.capacity is not None)
            most = max(p.capacity.gpus_per_node for p in pools if p.capacity is not None)
            gres.append(f"gpu:{type_of.get(flavor, flavor)}:{most}")
        out[name] = {"nodes": nodes, "gres": ",".join(gres) or "(null)"}
    return out


@router.get("/jobs", responses=problem_responses(403))
def jobs(
    request: Request,
    caller: Caller,
    team: str | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 500,
    cursor: str | None = None,
) -> dict[str, Any]:
    """``GET /v1/jobs`` (same scoping: users see their team only) with each job's current
    run: nodes, exit code, start and end as the backend reported them; and for a cancelled job
    who cancelled it (``cancelled_by``: a name, or ``system:...``), which sacct shows."""
    page = routes_jobs.page(request, caller, team, state, limit, cursor)
    db: Database = request.app.state.db
    with db.read() as s:
        found = runs.current_runs(s, [(j.id, j.attempt) for j in page.items])
        by = runs.cancellers(s, [j.id for j in page.items if j.state == JobState.CANCELLED])
    config: IsthmusConfig = request.app.state.config
    return {
        "items": [{**j.model_dump(mode="json"), "run": found.get(j.id),
                   "cancelled_by": by.get(j.id),
                   "partition": _partition_of(config, j.spec, found.get(j.id))}
                  for j in page.items],
        "next_cursor": page.next_cursor,
    }


@router.get("/whoami")
def whoami(caller: Caller) -> dict[str, Any]:
    """The caller as the broker sees it: isqueue --me and the default account need it."""
    return {"name": caller.name, "team": caller.team, "admin": caller.is_admin}


_BATCH_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False, "required": ["sbatch", "script"],
        "description": "what isbatch sends (isbatch.client_body): the normalised sbatch "
                       "request (isbatch --parse-only --json), its other options, the script",
        "properties": {
            "sbatch": {"type": "object"},
            "extra": {"type": "object"},
            "script": {"type": "string"},
            "script_path": {"type": ["string", "null"]},
            "submit_dir": {"type": ["string", "null"]},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }}},
}
"""The body of POST /v1/hpc/batch as OpenAPI states it (the route reads it raw so that its
parsing runs off the event loop; broker.orchestration.batch_submit.body_of checks it)."""


@router.post("/batch", status_code=201,
             responses=problem_responses(400, 403, 404, 413, 429),
             openapi_extra={"requestBody": _BATCH_BODY})
async def batch(request: Request, caller: Caller) -> dict[str, Any]:
    """isbatch's submission in one call: the parsed sbatch request in, ``{"id", "jobs"}`` out
    (``array_tasks`` too for an array: ``id`` is then the array's id)."""
    config: IsthmusConfig = request.app.state.config
    if config.slurm_compat is None:
        raise Problem(404, "no-slurm-compat", "sbatch requests are not configured",
                      "this broker has no slurm_compat section in its configuration")
    db: Database = request.app.state.db
    team = None if caller.is_admin else caller.team
    body = await request.body()
    compat = config.slurm_compat

    def parsed() -> tuple[Any, list[JobSpec]]:
        data = json.loads(body)
        specs = batch_submit.specs_of_body(data, compat, caller.team,
                                           batch_submit.resolver(db, team),
                                           batch_submit.ARRAY_PLACEHOLDER, caller.name,
                                           batch_submit.native_allowed(config))
        return data, [JobSpec.model_validate(s) for s in specs]

    try:  # off the event loop: a large request keeps no other caller waiting
        data, checked = await asyncio.to_thread(parsed)
    except (CompatError, SbatchError, ValueError, OverflowError, RecursionError) as exc:
        # pydantic's ValidationError is a ValueError; SbatchError carries sbatch's own words
        raise Problem(422, "sbatch-not-mapped", "The sbatch request cannot run here",
                      str(exc) or type(exc).__name__) from None
    for spec in checked[:1]:  # the tasks of an array differ in scheduling and env only
        problems = request_problems(config, spec, team)
        if problems:
            status = 403 if any(p.forbidden for p in problems) else 422
            raise Problem(status, "invalid-spec" if status == 422 else "forbidden-team",
                          "Invalid job spec" if status == 422 else "Not your team",
                          "; ".join(f"{p.field}: {p.message}" for p in problems))
    if checked:
        await check_queued(db, config, checked[0].team, caller.name, adding=len(checked))
    queue: SubmitQueue = request.app.state.submit_queue
    numbers: list[int | None] = [None] * len(checked)
    if data["sbatch"]["array"]:  # checked by specs_of_body: a str or None
        # An array's id is its first task's number, known before its tasks are stored.
        drawn = await asyncio.to_thread(_draw_numbers, db, len(checked))
        checked = batch_submit.numbered_array(checked, drawn)
        numbers = list(drawn)
    done = await asyncio.gather(*(
        queue.submit(Submission(spec, caller.name, number=n))
        for spec, n in zip(checked, numbers, strict=True)))
    ids = [d.job.id for d in done]
    if ids:
        audit_trail.about(f"job:{ids[0]}", jobs=ids[:100], count=len(ids))
    if data.get("extra", {}).get("hold"):  # sbatch --hold: stored held, until released
        await asyncio.to_thread(_hold_all, db, [d.job.id for d in done if d.created],
                                caller.name)
    if data["sbatch"]["array"]:
        return {"id": str(numbers[0]), "number": numbers[0], "array_tasks": ids,
                "task_numbers": [d.job.number for d in done], "jobs": ids}
    return {"id": ids[0], "number": done[0].job.number, "jobs": ids}


def _hold_all(db: Database, job_ids: list[str], actor: str) -> None:
    for job_id in job_ids:
        with contextlib.suppress(NotQueued):  # one rejected at submit: nothing to hold
            hold_job(db, job_id, actor)


def _draw_numbers(db: Database, count: int) -> list[int]:
    with db.write() as s:
        return job_numbers.allocate(s, count)


@router.post("/jobs/{job_id}/signal", responses=problem_responses(400, 404, 409, 503))
def signal(job_id: JobRef, request: Request, caller: Caller,
           name: Annotated[str, Body(embed=True, alias="signal", pattern=r"^[A-Z0-9]{1,8}$",
                                     description="e.g. USR1 (no SIG prefix)")],
           whom: Annotated[Literal["steps", "batch", "full"], Body(
               embed=True, description="the job's steps (scancel's default), its batch "
               "shell (scancel -b) or both (scancel -f)")] = "steps") -> dict[str, Any]:
    """``iscancel --signal``: send a signal to a running job's processes, as ``scancel
    --signal`` does on Slurm (to the job's steps, its batch shell, or both). Kubernetes has
    no way to signal a container's processes through its API: 409 there, saying so."""
    from backends.base import BackendUnavailable, Unsupported
    from broker.store import attempts as att

    db: Database = request.app.state.db
    job = routes_jobs._visible_job(db, job_id, caller)
    with db.read() as s:
        rows = att.attempts_of(s, job_id)
    a = rows[-1] if rows else None
    if job.state != JobState.RUNNING or a is None or a.dispatch != att.CREATED:
        raise Problem(409, "not-running", "Job is not running",
                      f"job {job_id} is {job.state}: only a running job can be signalled")
    config: IsthmusConfig = request.app.state.config
    backend = config.backend(a.backend)
    if backend is not None and backend.kind == "k8s":
        raise Problem(409, "signal-unsupported", "Signals do not reach Kubernetes pods",
                      f"job {job_id} runs on Kubernetes, whose API cannot send a signal to a "
                      "container's processes; cancel it instead (its pods get SIGTERM and the "
                      "job's grace period)")
    runtime = request.app.state.runtime
    sender = (getattr(runtime.plane.gate(a.backend), "send_signal", None)
              if runtime is not None and a.backend in runtime.plane.backends else None)
    if sender is None:
        raise Problem(503, "backend-not-reachable", "Backend cannot signal from here",
                      f"this server cannot signal jobs on backend '{a.backend}'")
    try:
        message = sender(a.backend_name, name, whom)
    except Unsupported as exc:
        raise Problem(409, "signal-unsupported", "Signal not sent", str(exc)) from None
    except BackendUnavailable as exc:
        raise Problem(503, "backend-unavailable", "Backend unavailable", str(exc)) from None
    return {"job_id": job_id, "signal": name, "whom": whom, "message": message}
