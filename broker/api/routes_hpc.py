"""/v1/hpc: what the HPC drop-ins (isbatch, isqueue, ...) need besides the jobs API.

isbatch maps an sbatch request to a JobSpec on the user's side, with the site's
``slurm_compat`` section read here, and submits it through ``POST /v1/jobs`` like any client:
the server checks the spec and the team exactly as for every other submission.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from broker.api import routes_jobs
from broker.api.auth import Principal, principal
from broker.api.problems import Problem, problem_responses
from broker.config import IsthmusConfig
from broker.domain.states import JobState
from broker.hpc import runs
from broker.store.db import Database

router = APIRouter(prefix="/v1/hpc", tags=["hpc"], responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


@router.get("/slurm-compat", responses=problem_responses(404))
def slurm_compat(request: Request, caller: Caller) -> dict[str, Any]:
    """The ``slurm_compat`` section and who the caller is (the default account is the team)."""
    config: IsthmusConfig = request.app.state.config
    if config.slurm_compat is None:
        raise Problem(404, "no-slurm-compat", "sbatch requests are not configured",
                      "this broker has no slurm_compat section in its configuration; "
                      "ask the platform team to map partitions, accounts and qos")
    return {
        "slurm_compat": config.slurm_compat.model_dump(mode="json"),
        "caller": {"name": caller.name, "team": caller.team, "admin": caller.is_admin},
    }


@router.get("/jobs")
def jobs(
    request: Request,
    caller: Caller,
    team: str | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 500,
    cursor: str | None = None,
) -> dict[str, Any]:
    """``GET /v1/jobs`` (same scoping: users see their team only) with each job's current
    run: nodes, exit code, start and end as the backend reported them."""
    page = routes_jobs.list_(request, caller, team, state, limit, cursor)
    db: Database = request.app.state.db
    with db.read() as s:
        found = runs.current_runs(s, [(j.id, j.attempt) for j in page.items])
    return {
        "items": [{**j.model_dump(mode="json"), "run": found.get(j.id)} for j in page.items],
        "next_cursor": page.next_cursor,
    }


@router.get("/whoami")
def whoami(caller: Caller) -> dict[str, Any]:
    """The caller as the broker sees it: isqueue --me and the default account need it."""
    return {"name": caller.name, "team": caller.team, "admin": caller.is_admin}
