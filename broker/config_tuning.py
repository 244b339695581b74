"""The `policies:` section of isthmus.yaml: every policy parameter with the code's default,
each section named after the pure policy's parameter object it becomes (broker/wiring).

The defaults are the parameter objects' own (`_of`), so `isthmus config check --show` cannot
print a default the policies do not use; this module adds only the YAML names, the bounds and
the words. (`broker.wiring.runtime.policy_params` maps the names back.)"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.spec import DAY
from policies.ordering import OrderingParams
from policies.placement import PlacementParams, ScoreWeights
from policies.preemption import PreemptionParams
from policies.retry import RetryParams
from policies.types import FAIR_SHARE_HALF_LIFE_S


def _of(params: type, name: str) -> Any:
    """The default of field `name` of the parameter dataclass `params`."""
    f = next(f for f in dataclasses.fields(params) if f.name == name)
    assert f.default is not dataclasses.MISSING, (params, name)
    return f.default


class Strict(BaseModel):
    """A section of isthmus.yaml: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryTuning(Strict):
    """policies.retry.RetryParams: what the retry engine allows beyond each job's own policy."""

    max_preemptions: int = Field(default=_of(RetryParams, "max_preemptions"), ge=0, le=1000)
    """Preemptions of one job before it fails with RetriesExhausted."""
    orchestration_retries: int = Field(
        default=_of(RetryParams, "orchestration_retries"), ge=0, le=100)
    """Retries after a lost or out-of-sync backend object (ORCHESTRATION)."""
    unknown_retries: int = Field(default=_of(RetryParams, "unknown_retries"), ge=0, le=100)
    """Retries after a failure the backend gave no evidence for (UNKNOWN)."""
    preemption_delay: int = Field(default=_of(RetryParams, "preemption_delay_s"), ge=0, le=DAY)
    """Seconds a preempted job waits before it is queued again."""
    infra_pool_exclude_after: int = Field(
        default=_of(RetryParams, "infra_pool_exclude_after"), ge=1, le=100)
    """Infrastructure failures in one pool before the job avoids that pool."""


class PreemptionTuning(Strict):
    """policies.preemption.PreemptionParams: the protection windows of running jobs."""

    min_runtime: float = Field(default=_of(PreemptionParams, "min_runtime_s"), ge=0, le=30 * DAY)
    """Seconds a job runs before it may be preempted."""
    protect_near_end: float = Field(
        default=_of(PreemptionParams, "protect_near_end_s"), ge=0, le=30 * DAY)
    """A job expected to end within this many seconds is not preempted."""
    max_victims: int = Field(default=_of(PreemptionParams, "max_victims"), ge=1, le=10_000)
    """Most jobs preempted for one pending job."""


class ScoreTuning(Strict):
    """policies.placement.ScoreWeights: how candidate pools are ranked (lower score wins)."""

    flavor: float = Field(default=_of(ScoreWeights, "flavor"), ge=0, le=1000)
    topology: float = Field(default=_of(ScoreWeights, "topology"), ge=0, le=1000)
    preferred_miss: float = Field(default=_of(ScoreWeights, "preferred_miss"), ge=0, le=1000)
    wait_per_hour: float = Field(default=_of(ScoreWeights, "wait_per_hour"), ge=0, le=1000)
    fragmentation: float = Field(default=_of(ScoreWeights, "fragmentation"), ge=0, le=1000)
    cost: float = Field(default=_of(ScoreWeights, "cost"), ge=0, le=1000)
    queued: float = Field(default=_of(ScoreWeights, "queued"), ge=0, le=1000)
    foreign_wait: float = Field(default=_of(ScoreWeights, "foreign_wait"), ge=0, le=1000)


class PlacementTuning(Strict):
    """policies.placement.PlacementParams."""

    weights: ScoreTuning = Field(default_factory=ScoreTuning)
    turnover: float = Field(default=_of(PlacementParams, "turnover_seconds"), gt=0, le=30 * DAY)
    """Seconds for a pool's worth of queued GPU demand to drain, when the backend gives no
    estimate: expected wait = pending GPUs / pool GPUs x turnover."""
    max_isthmus_pending: int = Field(
        default=_of(PlacementParams, "default_max_isthmus_pending"), ge=0, le=10_000)
    """Isthmus jobs that may wait in one shared pool's backend queue (0: none ever do)."""
    queue_max_gpus: int = Field(default=_of(PlacementParams, "queue_max_gpus"), ge=0, le=100_000)
    hold_queued_by_shape: bool = _of(PlacementParams, "hold_queued_by_shape")
    """Hold free GPUs for Isthmus jobs queued in a backend only where their gangs can start
    (backends that report the shapes: the simulated one); off: all their GPUs."""
    """Larger gangs never wait in a backend queue."""


class OrderingTuning(Strict):
    """policies.ordering.OrderingParams: starvation protection of large gangs."""

    starvation_after: float = Field(
        default=_of(OrderingParams, "starvation_after_s"), ge=0, le=366 * DAY)
    """Seconds a gang waits before it gets a capacity reservation."""
    reservation_min_gpus: int = Field(
        default=_of(OrderingParams, "reservation_min_gpus"), ge=1, le=100_000)
    max_reservations: int = Field(default=_of(OrderingParams, "max_reservations"), ge=0, le=1000)
    queue_closed_after: float = Field(
        default=_of(OrderingParams, "queue_closed_after_s"), ge=0, le=366 * DAY)
    """Seconds a gang waits before its reservation also guards the pool's backend queue (the
    backend, not knowing the hold, would start queued jobs on the held GPUs): new jobs queued
    there exclude the held nodes where the backend can (queue_exclude), else the queue closes."""
    queue_exclude: bool = _of(OrderingParams, "queue_exclude")
    """Guard by excluding the held nodes (Slurm CLI transport, Kubernetes plain mode, the
    simulator); off, or on other pools: close the queue."""
    backfill: bool = _of(OrderingParams, "backfill")
    """Later jobs may use held GPUs where, by their time limits, they do not delay the gang."""
    backfill_margin: float = Field(default=_of(OrderingParams, "backfill_margin_s"), ge=0, le=DAY)
    """Seconds added to a backfilled job's time limit: the backends' slack past the declared
    limit (Slurm's rounding to minutes and KillWait, Kubernetes' start-up timeout) and
    dispatch. Raise it when KillWait or all_ranks_timeout_s are longer than their defaults."""


class FairShareTuning(Strict):
    half_life: float = Field(default=FAIR_SHARE_HALF_LIFE_S, gt=0, le=366 * DAY)
    """Seconds after which past usage weighs half as much in fair share."""


class AdmissionTuning(Strict):
    """policies.cycle.AdmissionParams (besides placement and ordering)."""

    max_admissions: int | None = Field(default=None, ge=1, le=1_000_000)
    """Most admissions in one cycle (none: no limit)."""


class Policies(Strict):
    """Every policy parameter, each with the code's default (`isthmus config check --show`)."""

    retry: RetryTuning = Field(default_factory=RetryTuning)
    preemption: PreemptionTuning = Field(default_factory=PreemptionTuning)
    placement: PlacementTuning = Field(default_factory=PlacementTuning)
    ordering: OrderingTuning = Field(default_factory=OrderingTuning)
    fair_share: FairShareTuning = Field(default_factory=FairShareTuning)
    admission: AdmissionTuning = Field(default_factory=AdmissionTuning)
    cancel_grace: int | None = Field(default=None, ge=0, le=DAY)
    """Seconds a cancelled job gets to stop (none: the job's own checkpoint.grace)."""
