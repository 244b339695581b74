"""The `policies:` section of isthmus.yaml: every policy parameter with the code's default,
each section named after the pure policy's parameter object it becomes (broker/wiring)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.spec import DAY


class Strict(BaseModel):
    """A section of isthmus.yaml: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryTuning(Strict):
    """policies.retry.RetryParams: what the retry engine allows beyond each job's own policy."""

    max_preemptions: int = Field(default=10, ge=0, le=1000)
    """Preemptions of one job before it fails with RetriesExhausted."""
    orchestration_retries: int = Field(default=1, ge=0, le=100)
    """Retries after a lost or out-of-sync backend object (ORCHESTRATION)."""
    unknown_retries: int = Field(default=1, ge=0, le=100)
    """Retries after a failure the backend gave no evidence for (UNKNOWN)."""
    preemption_delay: int = Field(default=0, ge=0, le=DAY)
    """Seconds a preempted job waits before it is queued again."""
    infra_pool_exclude_after: int = Field(default=2, ge=1, le=100)
    """Infrastructure failures in one pool before the job avoids that pool."""


class PreemptionTuning(Strict):
    """policies.preemption.PreemptionParams: the protection windows of running jobs."""

    min_runtime: float = Field(default=600.0, ge=0, le=30 * DAY)
    """Seconds a job runs before it may be preempted."""
    protect_near_end: float = Field(default=900.0, ge=0, le=30 * DAY)
    """A job expected to end within this many seconds is not preempted."""
    max_victims: int = Field(default=32, ge=1, le=10_000)
    """Most jobs preempted for one pending job."""


class ScoreTuning(Strict):
    """policies.placement.ScoreWeights: how candidate pools are ranked (lower score wins)."""

    flavor: float = Field(default=1.0, ge=0, le=1000)
    topology: float = Field(default=0.25, ge=0, le=1000)
    preferred_miss: float = Field(default=0.5, ge=0, le=1000)
    wait_per_hour: float = Field(default=1.0, ge=0, le=1000)
    fragmentation: float = Field(default=0.5, ge=0, le=1000)
    cost: float = Field(default=0.1, ge=0, le=1000)
    queued: float = Field(default=1.0, ge=0, le=1000)
    foreign_wait: float = Field(default=1.0, ge=0, le=1000)


class PlacementTuning(Strict):
    """policies.placement.PlacementParams."""

    weights: ScoreTuning = Field(default_factory=ScoreTuning)
    turnover: float = Field(default=3600.0, gt=0, le=30 * DAY)
    """Seconds for a pool's worth of queued GPU demand to drain, when the backend gives no
    estimate: expected wait = pending GPUs / pool GPUs x turnover."""
    max_isthmus_pending: int = Field(default=0, ge=0, le=10_000)
    """Isthmus jobs that may wait in one shared pool's backend queue (0: none ever do)."""
    queue_max_gpus: int = Field(default=8, ge=0, le=100_000)
    hold_queued_by_shape: bool = False
    """Hold free GPUs for Isthmus jobs queued in a backend only where their gangs can start
    (backends that report the shapes: the simulated one); off: all their GPUs."""
    """Larger gangs never wait in a backend queue."""


class OrderingTuning(Strict):
    """policies.ordering.OrderingParams: starvation protection of large gangs."""

    starvation_after: float = Field(default=3600.0, ge=0, le=366 * DAY)
    """Seconds a gang waits before it gets a capacity reservation."""
    reservation_min_gpus: int = Field(default=8, ge=1, le=100_000)
    max_reservations: int = Field(default=4, ge=0, le=1000)
    queue_closed_after: float = Field(default=24 * 3600.0, ge=0, le=366 * DAY)
    """Seconds a gang waits before its reservation also guards the pool's backend queue (the
    backend, not knowing the hold, would start queued jobs on the held GPUs): new jobs queued
    there exclude the held nodes where the backend can (queue_exclude), else the queue closes."""
    queue_exclude: bool = True
    """Guard by excluding the held nodes (Slurm CLI transport, Kubernetes plain mode, the
    simulator); off, or on other pools: close the queue."""
    backfill: bool = True
    """Later jobs may use held GPUs where, by their time limits, they do not delay the gang."""
    backfill_margin: float = Field(default=420.0, ge=0, le=DAY)
    """Seconds added to a backfilled job's time limit: the backends' slack past the declared
    limit (Slurm's rounding to minutes and KillWait, Kubernetes' start-up timeout) and
    dispatch. Raise it when KillWait or all_ranks_timeout_s are longer than their defaults."""


class FairShareTuning(Strict):
    half_life: float = Field(default=3600.0, gt=0, le=366 * DAY)
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
