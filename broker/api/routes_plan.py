"""POST /v1/plan: what admission would decide for a spec now (like `sbatch --test-only`);
nothing is stored."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from broker.api.auth import Principal, principal
from broker.api.problems import problem_responses
from broker.api.routes_jobs import SPEC_BODY, checked_spec
from broker.config import IsthmusConfig
from broker.control.runtime import Runtime
from broker.domain.reasons import Reason
from broker.feasibility import feasibility
from policies.explain import Explanation, StartWindow

router = APIRouter(prefix="/v1", tags=["plan"], responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


class PlanOut(BaseModel):
    basis: Literal["admission", "feasibility"]
    """admission: the cycle was run on the control plane's inventory; feasibility: this
    server runs no control plane (`--no-control`), so only the configuration was checked."""
    would_reject: bool
    reason: Reason
    message: str
    admitted: bool
    """The next admission cycle would admit it now."""
    queued_ahead: int | None = None
    estimated_start: datetime | None = None
    estimate_method: str | None = None
    start_window: StartWindow | None = None
    """Where the start is likely to fall, with its stated coverage (None: no window)."""
    pool: str | None = None
    """Where it would start: the placement's pool when admitted now, else the pool in which
    the estimate found its start (None without an estimated date)."""
    nodes: list[str] = []
    """The nodes of that start, one entry per replica."""
    explanation: Explanation | None = None
    text: str | None = None
    """The explanation as `isthmus plan` prints it (None without one)."""
    note: str = ""


@router.post(
    "/plan", response_model=PlanOut, openapi_extra=SPEC_BODY,
    responses=problem_responses(400, 403, 413, 415),
)
async def plan(request: Request, caller: Caller) -> PlanOut:
    """Every pool's verdict, the chosen placement or the most severe reason, and the earliest
    estimated start for a job spec, as `explain` gives them for a submitted job. Same
    validation and team scoping as `POST /v1/jobs`; no job is created."""
    spec = await checked_spec(request, caller)
    config: IsthmusConfig = request.app.state.config
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        verdict = feasibility(config, spec)
        return PlanOut(
            basis="feasibility", would_reject=not verdict.ok, reason=verdict.reason,
            message=verdict.message, admitted=False,
            note="this server runs no control plane (--no-control): only the configuration "
                 "was checked; no placement or estimate",
        )
    from broker.control.whatif import plan as what_if

    # the cycle reads the database and asks the backends: off the event loop
    result = await run_in_threadpool(what_if, runtime.plane, spec)
    x = result.explanation
    if x is None:
        v = result.feasibility
        return PlanOut(basis="admission", would_reject=True, reason=v.reason,
                       message=v.message, admitted=False)
    return PlanOut(
        basis="admission", would_reject=False, reason=x.reason, message=x.message,
        admitted=x.admitted, queued_ahead=result.queued_ahead,
        estimated_start=x.estimated_start,
        estimate_method=x.estimate_method, start_window=x.start_window, pool=result.pool,
        nodes=list(result.nodes), explanation=x, text=x.to_text(),
        note="" if runtime.leading else "this replica does not lead the control loop; "
             "the answer uses its own view of the backends",
    )
