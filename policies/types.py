"""Neutral views the policies work on: pending jobs, quota configuration, usage, running jobs.

These are plain frozen dataclasses rather than pydantic models because an admission cycle
builds and reads tens of thousands of them; `broker.policy_inputs` builds them from the
configuration and stored specs. Times are always inputs (`datetime`, timezone-aware or not, but
consistent); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from broker.domain.topology import TopologyLevel

BackendConstraint = Literal["slurm", "k8s", "any"]


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One queued job as admission sees it (Kueue's 'workload info')."""

    id: str
    team: str
    replicas: int
    gpus_per_replica: int
    flavors: tuple[str, ...]
    """Acceptable flavors, most preferred first (already narrowed by constraints)."""
    submitted_at: datetime
    queue: str = "default"
    user: str = ""
    """Who submitted it (per-user concurrency limits)."""
    priority: int = 0
    priority_class: str = "normal"
    can_preempt: bool = False
    """The job's priority class may preempt lower-priority work."""
    preempts_across_teams: bool = False
    """... also another team's work that runs within its team's nominal quota (else only its
    own team's, and other teams' jobs on borrowed quota)."""
    cpus_per_replica: int | None = None
    memory_per_replica: int | None = None
    one_per_node: bool = False
    """Replicas on distinct nodes (sbatch -N): at most one of them per node."""
    topology_required: TopologyLevel | None = None
    topology_preferred: TopologyLevel | None = None
    backend: BackendConstraint = "any"
    exclude_pools: frozenset[str] = frozenset()
    exclude_nodes: frozenset[str] = frozenset()
    not_before: datetime | None = None
    """End of a retry backoff; the job is not considered before it."""
    checkpoint_interval_s: int | None = None
    resumable: bool = False
    max_runtime_s: int = 86400
    image: str | None = None
    """entrypoint.image: only pools that run images may take the job."""

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """A team's quota for one flavor, in GPUs (Kueue's nominal/borrowing/lending limits)."""

    nominal: int
    borrowing_limit: int | None = None
    """Most GPUs the team may use above nominal; None: no limit other than the cohort."""
    lending_limit: int | None = None
    """Most of its nominal GPUs others may borrow; None: all of them."""

    @property
    def lendable(self) -> int:
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)

    @property
    def guaranteed(self) -> int:
        """Nominal GPUs nobody else may borrow."""
        return self.nominal - self.lendable


NO_QUOTA = FlavorQuota(nominal=0, borrowing_limit=0, lending_limit=0)


@dataclass(frozen=True, slots=True)
class TeamQuota:
    name: str
    cohort: str | None = None
    quotas: Mapping[str, FlavorQuota] = field(default_factory=dict)
    weight: float = 1.0
    """Fair-share weight: a team of weight 2 may use twice the share before falling behind."""
    queue_weights: Mapping[str, float] = field(default_factory=dict)
    """The team's queues and their fair-share weights (empty: one queue, every job in it)."""
    queue_shares: Mapping[str, float] = field(default_factory=dict)
    """The queues with a share of the team's quota (0 < share <= 1; policies/queue_share.py)."""


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    teams: Mapping[str, TeamQuota]
    flavor_cost: Mapping[str, float] = field(default_factory=dict)

    def quota(self, team: str, flavor: str) -> FlavorQuota:
        t = self.teams.get(team)
        if t is None:
            return NO_QUOTA
        return t.quotas.get(flavor, NO_QUOTA)

    def cohort_of(self, team: str) -> str | None:
        t = self.teams.get(team)
        return t.cohort if t else None

    def cost(self, flavor: str) -> float:
        return self.flavor_cost.get(flavor, 1.0)


@dataclass(frozen=True, slots=True)
class Usage:
    """The ledger as policies see it.

    `in_use` counts GPUs reserved by admitted and running jobs per (team, flavor); what lies
    above the team's nominal quota is borrowed (`borrowed`). `decayed` is the recent average
    of GPUs in use per (team, flavor), kept by the caller with `decay_usage`; fair share uses
    it, falling back to `in_use` when a team has no history.
    """

    in_use: Mapping[tuple[str, str], int] = field(default_factory=dict)
    decayed: Mapping[tuple[str, str], float] = field(default_factory=dict)
    queue_gpus: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """GPUs held by admitted and running jobs per (team, queue): fair sharing among a team's
    queues (read only for teams with more than one queue)."""
    queue_flavor_gpus: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """GPUs held by admitted and running jobs per (team, queue, flavor): the queues' shares
    (read only when some queue has a share)."""

    def used(self, team: str, flavor: str) -> int:
        return self.in_use.get((team, flavor), 0)

    def borrowed(self, team: str, flavor: str, quotas: QuotaConfig) -> int:
        return max(0, self.used(team, flavor) - quotas.quota(team, flavor).nominal)


FAIR_SHARE_HALF_LIFE_S = 3600.0
"""The default half-life of past usage in fair share (`policies.fair_share.half_life`)."""


def decay_usage(
    previous: float, current_gpus: float, elapsed_s: float, half_life_s: float
) -> float:
    """Exponentially weighted average of GPUs in use: history loses half its weight every
    `half_life_s` seconds. With no elapsed time the previous value stands."""
    if elapsed_s <= 0:
        return previous
    if half_life_s <= 0:
        return current_gpus
    keep = math.pow(0.5, elapsed_s / half_life_s)
    return previous * keep + current_gpus * (1.0 - keep)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """An admitted or running job, as preemption sees it."""

    id: str
    team: str
    flavor: str
    pool: str
    gpus: int
    priority: int
    started_at: datetime
    last_checkpoint_at: datetime | None = None
    expected_end: datetime | None = None
    borrowed: bool = False
    """Some of its GPUs lie above its team's nominal quota (reclaimable by the lenders)."""
    grace_seconds: int = 120
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolRoom:
    """One pool as priority preemption needs to see it for one job: the free GPUs of each node
    in the admission cycle's working copy now, and the domain of each node at the level the
    job requires. Preemption then stops only jobs whose GPUs, added to the free ones, let the
    gang fit (each replica on one node, all replicas in one domain)."""

    level: str
    """The job's required topology level: 'node', 'rack', 'block', or 'pool' when none."""
    domain: Mapping[str, str]
    """The domain at `level` of every node of the pool ('' when the level is the pool)."""
    free: Mapping[str, int]
    """Free GPUs of every node the job may use; GPUs freed on nodes absent here
    (unschedulable, excluded for the job) do not count."""
    size: Mapping[str, int]
    """GPUs of every node the job may use: freed GPUs never count beyond it."""
