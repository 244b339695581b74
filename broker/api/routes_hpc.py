"""/v1/hpc: what the HPC drop-ins (isbatch, isqueue, ...) need besides the jobs API.

isbatch maps an sbatch request to a JobSpec on the user's side, with the site's
``slurm_compat`` section read here, and submits it through ``POST /v1/jobs`` like any client:
the server checks the spec and the team exactly as for every other submission.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from broker.api.auth import Principal, principal
from broker.api.problems import Problem
from broker.config import IsthmusConfig

router = APIRouter(prefix="/v1/hpc", tags=["hpc"])
Caller = Annotated[Principal, Depends(principal)]


@router.get("/slurm-compat")
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
