"""What-if: what admission would decide for a spec now, without storing anything.

The same code path as the admission cycle (broker.control.admission.cycle_inputs and decide):
the queued jobs, one inventory snapshot, quotas and usage, and the pure cycle with the
planned job added at the back of its priority (it is the newest submission), then the queue
estimates (policies.eta). Nothing is written: the fair-share history is not folded, no
explanation or cycle record is saved, and victims a plan names are not preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.control.admission import cycle_inputs, decide
from broker.control.plane import ControlPlane
from broker.domain.spec import JobSpec
from broker.feasibility import Verdict, feasibility
from broker.policy_inputs import pending_job
from policies.eta import Estimate
from policies.explain import Explanation, explain

PLAN_ID = "plan"
"""The planned job's id in the cycle: not a job id (those are ULIDs), so it meets none."""


@dataclass(frozen=True)
class Plan:
    feasibility: Verdict
    explanation: Explanation | None
    """None when the spec is infeasible (it would be REJECTED) or no control plane runs."""
    queued_ahead: int = 0
    """Jobs queued now that the cycle orders before the planned one."""
    pool: str | None = None
    """Where it would start: the placement's pool when admitted now, else the pool of the
    estimate's replay (None without an estimated date)."""
    nodes: tuple[str, ...] = ()
    """The nodes of that start, one entry per replica."""


def plan(plane: ControlPlane, spec: JobSpec) -> Plan:
    verdict = feasibility(plane.config, spec)
    if not verdict.ok:
        return Plan(verdict, None)
    now = plane.clock()
    inputs = cycle_inputs(plane, now, fold_usage=False)
    job = pending_job(plane.config, PLAN_ID, spec, now)
    result, estimates = decide(plane, inputs, (job,))
    mine = result.by_job()[PLAN_ID]
    ahead = sum(
        1 for d in result.decisions
        if d.job_id != PLAN_ID and 0 <= d.position < mine.position
    )
    estimate = estimates.get(PLAN_ID)
    if mine.admitted:
        p = mine.placement
        estimate = Estimate(PLAN_ID, 0, 0, now, "now", p.pool if p else None,
                            p.nodes if p else ())
    pool = estimate.pool if estimate and estimate.at is not None else None
    nodes = estimate.nodes if pool is not None and estimate else ()
    return Plan(verdict, explain(mine, estimate), ahead, pool, nodes)
