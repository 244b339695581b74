"""Builds the policies' neutral views from the configuration, stored specs and attempts.

The policies never see `IsthmusConfig` or `JobSpec`: this module translates them into the
policies' views each cycle, as broker/wiring translates the configuration into the policies'
parameters at start-up (the import-linter contracts in pyproject.toml keep `broker.config` out
of `policies`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime

from broker.config import ConcurrencyLimits, IsthmusConfig
from broker.domain.attempts import Attempt
from broker.domain.failures import FailureCategory
from broker.domain.spec import JobSpec
from broker.domain.timebox import add_seconds
from broker.feasibility import acceptable_flavors
from policies.budgets import Budget, BudgetInputs, Period, period_bounds
from policies.concurrency import Caps, ConcurrencyInputs, Held
from policies.retry import AttemptCounts
from policies.types import FlavorQuota, PendingJob, QuotaConfig, RunningJob, TeamQuota, Usage


def quota_config(config: IsthmusConfig) -> QuotaConfig:
    teams = {
        t.name: TeamQuota(
            name=t.name,
            cohort=t.cohort,
            quotas={
                flavor: FlavorQuota(q.nominal, q.borrowing_limit, q.lending_limit)
                for flavor, q in t.quotas.items()
            },
            weight=t.weight,
            queue_weights={q.name: q.weight for q in t.queues},
            queue_shares=t.queue_shares(),
        )
        for t in config.teams
    }
    return QuotaConfig(teams=teams, flavor_cost={f.name: f.cost_weight for f in config.flavors})


def pending_job(
    config: IsthmusConfig,
    job_id: str,
    spec: JobSpec,
    submitted_at: datetime,
    *,
    not_before: datetime | None = None,
    exclude_pools: Iterable[str] = (),
    exclude_nodes: Iterable[str] = (),
    user: str = "",
) -> PendingJob:
    """The admission view of a queued job. Unknown priority classes count as value 0 (the API
    refuses them, so this only matters for jobs stored before a class was removed)."""
    pc = config.priority_class(spec.priority)
    team = config.team(spec.team)
    return PendingJob(
        id=job_id,
        team=spec.team,
        queue=team.queue_of(spec.queue) if team is not None else spec.queue,
        user=user,
        priority=pc.value if pc else 0,
        priority_class=spec.priority,
        can_preempt=bool(pc and pc.preempting),
        preempts_across_teams=bool(pc and pc.preempting and pc.preempt_across_teams),
        replicas=spec.gang.replicas,
        gpus_per_replica=spec.gang.gpus_per_replica,
        cpus_per_replica=spec.gang.cpus_per_replica,
        memory_per_replica=spec.gang.memory_per_replica,
        one_per_node=spec.gang.one_per_node,
        flavors=tuple(f.name for f in acceptable_flavors(config, spec)),
        topology_required=spec.topology.required,
        topology_preferred=spec.topology.preferred,
        backend=spec.backend,
        submitted_at=submitted_at,
        exclude_pools=frozenset(exclude_pools),
        exclude_nodes=frozenset(exclude_nodes),
        not_before=not_before,
        checkpoint_interval_s=spec.checkpoint.interval,
        resumable=spec.checkpoint.resumable,
        max_runtime_s=spec.max_runtime,
        image=spec.entrypoint.ranks_image,
    )


def caps(limits: ConcurrencyLimits) -> Caps:
    return Caps(limits.running_jobs, limits.queued_jobs, limits.gpus)


def concurrency(config: IsthmusConfig,
                held: Mapping[tuple[str, str], tuple[int, int]]) -> ConcurrencyInputs:
    """The concurrency limits of every team and its users, and (jobs, GPUs) held per (team,
    user) summed per team too."""
    team_held: dict[str, Held] = {}
    for (team, _), (jobs, gpus) in held.items():
        t = team_held.get(team, Held())
        team_held[team] = Held(t.jobs + jobs, t.gpus + gpus)
    return ConcurrencyInputs(
        team_caps={t.name: caps(t.limits) for t in config.teams},
        user_caps={t.name: caps(config.user_limits_of(t.name)) for t in config.teams
                   if t.user_limits != ConcurrencyLimits()},
        default_user=caps(config.user_limits),
        team_held=team_held,
        user_held={k: Held(*v) for k, v in held.items()},
    )


def limits_configured(config: IsthmusConfig) -> bool:
    """Whether any running-jobs or GPU limit is set (else admission reads no counts)."""
    return any(c.bounds_admission for c in (
        caps(config.user_limits), *(caps(t.limits) for t in config.teams),
        *(caps(t.user_limits) for t in config.teams)))


def budget_periods(config: IsthmusConfig) -> frozenset[Period]:
    """The periods some budget is set for (empty: no budget, nothing to read)."""
    return frozenset(b.period for t in config.teams for b in (*t.budgets, *t.user_budgets))


def budget_windows(config: IsthmusConfig, now: datetime, team: str | None = None
                   ) -> dict[date, tuple[set[str], set[str]]]:
    """What the budgets' use is read over: per first UTC day of a current period, the teams
    with a team budget and the teams with a user budget for that period (`team`: that one)."""
    out: dict[date, tuple[set[str], set[str]]] = {}
    for t in config.teams:
        if team is not None and t.name != team:
            continue
        for b in t.budgets:
            out.setdefault(period_bounds(b.period, now)[0].date(), (set(), set()))[0].add(t.name)
        for b in t.user_budgets:
            out.setdefault(period_bounds(b.period, now)[0].date(), (set(), set()))[1].add(t.name)
    return out


def budgets(config: IsthmusConfig,
            used: Mapping[date, Mapping[tuple[str, str | None], float]],
            now: datetime) -> BudgetInputs:
    """Every configured budget in the period holding `now`, with the GPU-hours used in it
    (`used`: per period start, per team and (team, user); broker.store.budget_usage over
    `budget_windows`). A user budget applies to each user of the team: one Budget per user
    with usage in the period (a user without any has used nothing and is not held back)."""
    by_team: dict[str, tuple[Budget, ...]] = {}
    for t in config.teams:
        out: list[Budget] = []
        for b in t.budgets:
            start, renews = period_bounds(b.period, now)
            hours = used.get(start.date(), {}).get((t.name, None), 0.0)
            out.append(Budget(t.name, None, b.period, b.gpu_hours, hours, start, renews,
                              tuple(b.warn_at), b.enforce))
        for b in t.user_budgets:
            start, renews = period_bounds(b.period, now)
            in_period = used.get(start.date(), {})
            for (team, user), hours in sorted(in_period.items(), key=lambda kv: kv[0][1] or ""):
                if team == t.name and user is not None:
                    out.append(Budget(t.name, user, b.period, b.gpu_hours, hours, start,
                                      renews, tuple(b.warn_at), b.enforce))
        if out:
            by_team[t.name] = tuple(out)
    lowest = config.lowest_priority_class()
    return BudgetInputs(by_team, lowest.value if lowest else 0, lowest.name if lowest else "low")


def usage(
    in_use: Mapping[tuple[str, str], int], decayed: Mapping[tuple[str, str], float] | None = None,
    queue_gpus: Mapping[tuple[str, str], int] | None = None,
    queue_flavor_gpus: Mapping[tuple[str, str, str], int] | None = None,
) -> Usage:
    return Usage(in_use=dict(in_use), decayed=dict(decayed or {}),
                 queue_gpus=dict(queue_gpus or {}),
                 queue_flavor_gpus=dict(queue_flavor_gpus or {}))


def queues_configured(config: IsthmusConfig) -> bool:
    """Some team has queues to share among (GPUs held per queue are then read each cycle)."""
    return any(len(t.queues) > 1 for t in config.teams)


def queue_shares_configured(config: IsthmusConfig) -> bool:
    """Some queue has a share (GPUs held per queue and flavor are then read each cycle)."""
    return any(t.queue_shares() for t in config.teams)


def running_job(
    config: IsthmusConfig,
    job_id: str,
    spec: JobSpec,
    *,
    flavor: str,
    pool: str,
    started_at: datetime,
    last_checkpoint_at: datetime | None = None,
    borrowed: bool = False,
    nodes: Sequence[str] = (),
    admitted_as: str | None = None,
) -> RunningJob:
    """The preemption view of an admitted or running job; its expected end is the start plus
    its max_runtime (the only bound Isthmus knows for sure), saturating far in the future: a
    stored spec is not trusted to hold a sane duration. `admitted_as`: the priority class its
    attempt was admitted as when not its spec's (a spent `lowest` GPU-hour budget)."""
    pc = config.priority_class(admitted_as or spec.priority)
    return RunningJob(
        id=job_id,
        team=spec.team,
        flavor=flavor,
        pool=pool,
        gpus=spec.gang.total_gpus,
        priority=pc.value if pc else 0,
        started_at=started_at,
        last_checkpoint_at=last_checkpoint_at,
        expected_end=add_seconds(started_at, spec.max_runtime),
        borrowed=borrowed,
        grace_seconds=spec.checkpoint.grace,
        nodes=tuple(nodes),
    )


def attempt_counts(attempts: Sequence[Attempt]) -> AttemptCounts:
    """Counts for the retry engine from a job's attempts, the one just ended last."""
    failures = [a for a in attempts if a.failure is not None and not a.preempted]
    by_category: Counter[FailureCategory] = Counter(
        a.failure for a in failures if a.failure is not None
    )
    last = attempts[-1] if attempts else None
    pool = last.snapshot.placement.pool if last and last.snapshot.placement else None
    in_pool = sum(
        1
        for a in failures
        if a.snapshot.placement is not None and a.snapshot.placement.pool == pool
    )
    return AttemptCounts(
        failures=len(failures),
        preemptions=sum(1 for a in attempts if a.preempted),
        by_category=dict(by_category),
        failures_in_pool=in_pool if pool else 0,
    )
