"""Preemption: choose running jobs to stop, only for higher priority or for quota reclaim.

Three modes:
- `priority`: the pending job's priority class may preempt, and victims in the same pool have a
  strictly lower priority and are of the job's own team or run on borrowed quota (another
  team's job within its nominal quota is guaranteed: stopped only by a class that may preempt
  across teams, `preempts_across_teams`, as Kueue's ClusterQueue preemption distinguishes
  `withinClusterQueue` from `reclaimWithinCohort`);
- `team`: the pending job's priority class may preempt and its team's quota of a flavor is
  full; victims are the same team's jobs of that flavor with a strictly lower priority (Kueue's
  `withinClusterQueue: LowerPriority`), so a team decides what runs inside its own quota;
- `reclaim`: the pending job asks for capacity inside its team's own nominal quota that was lent
  out; victims are jobs of other teams of the same cohort running on borrowed quota of that
  flavor, whatever their priority.
Never victims: jobs that have run less than `min_runtime_s` (so that one job cannot be
preempted again and again before it does any useful work), and jobs expected to end within
`protect_near_end_s` (waiting for them is cheaper than redoing them).

Victims are taken by lowest priority, then least work lost since their last checkpoint (GPUs x
hours since the checkpoint, or since the start when there is none), then youngest, then id,
until enough room is freed; victims that turn out unnecessary are then dropped again, most
expensive first. Each victim gets its own grace period (the job's checkpoint grace) and a reason.

`team` and `reclaim` count GPUs of the flavor: quota, not placement, is what they free.
`priority` with a `PoolRoom` (what admission passes) is topology-aware (policies.victim_room):
for each domain at the job's required level (the whole pool when none) it takes, in the order
above, only victims whose nodes all lie in that domain, until the gang fits node by node (each
replica needs `gpus_per_replica` GPUs on one node: free GPUs plus those freed there, a victim
freeing gpus / len(nodes) per entry of its node list); the domain whose plan loses the least
work wins (then fewest victims, then name). When no domain can be made to fit there are no
victims: stopping work elsewhere would destroy it for nothing. Fragmented pools, with enough
free GPUs but not in one place, are planned the same way. A victim whose nodes span two domains
frees room in neither and is skipped; GPUs freed on nodes the job may not use (unschedulable,
excluded) do not count. CPU and memory are not modelled: the next admission cycle checks them
with the victims gone. Victims without a node list (attempts from before placements recorded
nodes) cannot be located: when no domain fits without them and the pool is short of GPUs, the
plan falls back to counting GPUs in the pool, as without a `PoolRoom`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from broker.domain.reasons import Reason
from policies.types import PendingJob, PoolRoom, QuotaConfig, RunningJob
from policies.victim_room import best_domain

Mode = Literal["priority", "team", "reclaim"]


@dataclass(frozen=True, slots=True)
class PreemptionParams:
    min_runtime_s: float = 600.0
    protect_near_end_s: float = 900.0
    max_victims: int = 32


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: str
    team: str
    pool: str
    gpus: int
    grace_seconds: int
    lost_gpu_hours: float
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    ok: bool
    victims: tuple[Victim, ...]
    freed_gpus: int
    reason: Reason
    message: str
    domain: str | None = None
    """Where the gang is to fit once the victims are gone (topology-aware plans only)."""


def lost_gpu_hours(job: RunningJob, now: datetime) -> float:
    since = job.last_checkpoint_at or job.started_at
    return max(0.0, (now - since).total_seconds()) / 3600.0 * job.gpus


def protection(job: RunningJob, now: datetime, params: PreemptionParams) -> str | None:
    """Why `job` may not be preempted now, or None."""
    ran = (now - job.started_at).total_seconds()
    if ran < params.min_runtime_s:
        return f"ran {ran / 60:.0f} min, under the minimum of {params.min_runtime_s / 60:.0f}"
    if job.expected_end is not None:
        left = (job.expected_end - now).total_seconds()
        if left < params.protect_near_end_s:
            return f"expected to end in {max(0.0, left) / 60:.0f} min"
    return None


def select_victims(
    job: PendingJob,
    gpus_needed: int,
    running: Iterable[RunningJob],
    now: datetime,
    mode: Mode,
    *,
    pool: str | None = None,
    flavor: str | None = None,
    quotas: QuotaConfig | None = None,
    params: PreemptionParams | None = None,
    taken: frozenset[str] = frozenset(),
    room: PoolRoom | None = None,
) -> PreemptionPlan:
    """Victims freeing `gpus_needed` GPUs, or, in priority mode with a `room`, victims after
    whose end the gang fits in one domain of the pool (`gpus_needed` then only serves the
    fallback for victims without a node list; it may be 0 when the pool is fragmented)."""
    params = params or PreemptionParams()
    topology = room is not None and mode == "priority"
    if gpus_needed <= 0 and not topology:
        return PreemptionPlan(True, (), 0, Reason.Admitted, "nothing to preempt")
    if mode != "reclaim" and not job.can_preempt:
        return PreemptionPlan(
            False,
            (),
            0,
            Reason.InsufficientCapacity,
            f"priority class {job.priority_class} may not preempt",
        )
    eligible, spared = _eligible(job, running, now, mode, pool, flavor, quotas, params, taken)
    if room is not None and topology:
        return _room_plan(job, eligible, spared, gpus_needed, room, now, params)
    return _count_plan(job, eligible, spared, gpus_needed, mode, now, params)


@dataclass(frozen=True, slots=True)
class _Spared:
    """Jobs the mode would stop but may not: protected (too young, near their end), and
    guaranteed (other teams' jobs within their nominal quota, in priority mode)."""

    protected: int = 0
    guaranteed: int = 0

    def __str__(self) -> str:
        parts = [f"{self.protected} protected"] if self.protected else []
        if self.guaranteed:
            parts.append(f"{self.guaranteed} guaranteed: other teams' jobs within their "
                         "nominal quota")
        return f" ({'; '.join(parts)})" if parts else ""


def _eligible(
    job: PendingJob,
    running: Iterable[RunningJob],
    now: datetime,
    mode: Mode,
    pool: str | None,
    flavor: str | None,
    quotas: QuotaConfig | None,
    params: PreemptionParams,
    taken: frozenset[str],
) -> tuple[list[RunningJob], _Spared]:
    """The jobs `mode` may stop for `job`, cheapest first, and how many more it spares."""
    cohort = quotas.cohort_of(job.team) if quotas is not None else None
    eligible: list[RunningJob] = []
    protected = guaranteed = 0
    for r in running:
        if r.id in taken:
            continue
        if mode == "priority":
            if r.pool != pool or r.priority >= job.priority:
                continue
            if r.team != job.team and not r.borrowed and not job.preempts_across_teams:
                guaranteed += 1  # another team's guaranteed job: only its own team stops it
                continue
        elif mode == "team":
            if r.team != job.team or r.flavor != flavor or r.priority >= job.priority:
                continue
        else:
            if (
                cohort is None
                or r.flavor != flavor
                or not r.borrowed
                or r.team == job.team
                or quotas is None
                or quotas.cohort_of(r.team) != cohort
            ):
                continue
        if protection(r, now, params) is not None:
            protected += 1
            continue
        eligible.append(r)
    eligible.sort(
        key=lambda r: (r.priority, lost_gpu_hours(r, now), -r.started_at.timestamp(), r.id)
    )
    return eligible, _Spared(protected, guaranteed)


def _count_plan(
    job: PendingJob,
    eligible: list[RunningJob],
    spared: _Spared,
    gpus_needed: int,
    mode: Mode,
    now: datetime,
    params: PreemptionParams,
) -> PreemptionPlan:
    """Victims counted in GPUs, wherever they run."""
    chosen: list[RunningJob] = []
    freed = 0
    for r in eligible:
        if freed >= gpus_needed or len(chosen) >= params.max_victims:
            break
        chosen.append(r)
        freed += r.gpus
    if freed < gpus_needed:
        what = {"priority": "lower-priority", "team": f"lower-priority {job.team}",
                "reclaim": "borrowed"}[mode]
        return PreemptionPlan(
            False,
            (),
            0,
            Reason.InsufficientCapacity,
            f"only {freed} {what} GPUs can be preempted{spared}; "
            f"{gpus_needed} needed",
        )
    # drop victims that are not needed, the costliest first
    for r in sorted(chosen, key=lambda r: (-lost_gpu_hours(r, now), r.id)):
        if freed - r.gpus >= gpus_needed:
            chosen.remove(r)
            freed -= r.gpus
    return _chosen(job, chosen, mode, now, None)


def _chosen(
    job: PendingJob, chosen: list[RunningJob], mode: Mode, now: datetime, domain: str | None
) -> PreemptionPlan:
    victims = tuple(_victim(r, job, mode, now) for r in chosen)
    freed = sum(v.gpus for v in victims)
    # the preempting job's team is told its own victims' ids, never another team's
    ids = ", ".join(v.job_id if v.team == job.team else "a job of another team"
                    for v in victims)
    where = f" in {domain or 'the pool'}" if domain is not None else ""
    return PreemptionPlan(
        True,
        victims,
        freed,
        Reason.WaitingForPreemption,
        f"preempting {len(victims)} job(s) ({ids}) to free {freed} GPUs{where}",
        domain,
    )


def _room_plan(
    job: PendingJob,
    eligible: list[RunningJob],
    spared: _Spared,
    gpus_needed: int,
    room: PoolRoom,
    now: datetime,
    params: PreemptionParams,
) -> PreemptionPlan:
    """The cheapest domain in which stopping eligible jobs lets the gang fit."""
    best, unlocated = best_domain(
        job, eligible, room, params.max_victims, lambda r: lost_gpu_hours(r, now)
    )
    if best is not None:
        return _chosen(job, best.victims, "priority", now, best.domain)
    if unlocated and gpus_needed > 0:
        return _count_plan(job, eligible, spared, gpus_needed, "priority", now, params)
    if eligible:
        within = f"one {room.level}" if room.level != "pool" else "the pool"
        why = (
            f"stopping lower-priority work ({len(eligible)} job(s) preemptible"
            f"{spared}) leaves no room for {job.replicas} x "
            f"{job.gpus_per_replica} GPUs within {within}"
        )
    else:
        why = f"no lower-priority job can be preempted{spared}"
    return PreemptionPlan(
        False, (), 0, Reason.InsufficientCapacity, f"preemption would not help: {why}"
    )


def _victim(r: RunningJob, job: PendingJob, mode: Mode, now: datetime) -> Victim:
    if mode == "priority":
        why = f"for job {job.id} of priority {job.priority} (this job: {r.priority})"
    elif mode == "team":
        why = (f"for job {job.id} of the same team with priority {job.priority} (this job: "
               f"{r.priority}); team {job.team}'s {r.flavor} quota is full")
    else:
        why = f"team {job.team} reclaims {r.flavor} quota lent to team {r.team}"
    lost = lost_gpu_hours(r, now)
    since = "the last checkpoint" if r.last_checkpoint_at else "it started (no checkpoint)"
    return Victim(
        r.id,
        r.team,
        r.pool,
        r.gpus,
        r.grace_seconds,
        round(lost, 4),
        Reason.Preempted,
        f"preempted {why}; {lost:.2f} GPU-hours since {since}",
    )


class Preemptor:
    """The admission cycle's preemption oracle over one list of running jobs. Victims chosen
    for one pending job are not offered again in the same cycle."""

    def __init__(
        self,
        running: Sequence[RunningJob],
        quotas: QuotaConfig,
        now: datetime,
        params: PreemptionParams | None = None,
    ) -> None:
        self.running = list(running)
        self.quotas = quotas
        self.now = now
        self.params = params or PreemptionParams()
        self.taken: set[str] = set()
        # priority victims come from the job's pool only: most calls then scan a fraction
        self._by_pool: dict[str, list[RunningJob]] = {}
        for r in self.running:
            self._by_pool.setdefault(r.pool, []).append(r)

    def plan(
        self,
        job: PendingJob,
        mode: Mode,
        gpus_needed: int,
        pool: str | None,
        flavor: str | None,
        room: PoolRoom | None = None,
    ) -> PreemptionPlan:
        running = self.running
        if mode == "priority":
            running = self._by_pool.get(pool, []) if pool is not None else []
        plan = select_victims(
            job,
            gpus_needed,
            running,
            self.now,
            mode,
            pool=pool,
            flavor=flavor,
            quotas=self.quotas,
            params=self.params,
            taken=frozenset(self.taken),
            room=room,
        )
        if plan.ok:
            self.taken.update(v.job_id for v in plan.victims)
        return plan
