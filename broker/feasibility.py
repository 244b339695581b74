"""Checks of a JobSpec against the configuration, before a job is queued.

Two kinds of answer:
- `request_problems`: the request itself is wrong for this installation (unknown team, flavor
  or priority class, a gang above the configured cap). The API answers 4xx; nothing is stored.
- `feasibility`: the spec is well formed but could never run here (no pool offers its flavors,
  it names an image and no such pool runs images, larger than any pool's topology domain, no
  quota reachable in the team's cohort). The job is stored and goes VALIDATING -> REJECTED
  with a reason saying which limit and by how much.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.config import (
    Flavor,
    IsthmusConfig,
    Limits,
    Notices,
    Pool,
    PoolCapacity,
    Team,
    Tenancy,
)
from broker.config_native import native_problems
from broker.domain import Reason, metadata_keys
from broker.domain.inventory import pool_is_candidate
from broker.domain.notices import webhook_host
from broker.domain.spec import JobSpec
from broker.domain.topology import TopologyLevel
from broker.domain.units import format_duration, format_size


@dataclass(frozen=True, slots=True)
class FieldProblem:
    field: str
    message: str
    forbidden: bool = False  # the caller may not ask this (another team's spec): 403, not 422


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: Reason
    message: str


def request_problems(
    config: IsthmusConfig, spec: JobSpec, caller_team: str | None
) -> list[FieldProblem]:
    out: list[FieldProblem] = []
    if config.team(spec.team) is None:
        known = ", ".join(sorted(t.name for t in config.teams)) or "none configured"
        out.append(FieldProblem("team", f"unknown team '{spec.team}'; known teams: {known}"))
    elif caller_team is not None and spec.team != caller_team:
        out.append(
            FieldProblem("team", f"your token belongs to team '{caller_team}', not '{spec.team}'",
                         forbidden=True)
        )
    team = config.team(spec.team)
    if team is not None and team.queues and spec.queue not in team.queue_names():
        out.append(FieldProblem(
            "queue", f"team '{spec.team}' has no queue '{spec.queue}'; use one of "
            f"{', '.join(team.queue_names())} (teams[].queues in isthmus.yaml)"))
    for i, name in enumerate(spec.flavors):
        if config.flavor(name) is None:
            known = ", ".join(sorted(f.name for f in config.flavors)) or "none configured"
            out.append(FieldProblem(f"flavors[{i}]", f"unknown flavor '{name}'; known: {known}"))
    pc = config.priority_class(spec.priority)
    if pc is None:
        known = ", ".join(p.name for p in config.priority_classes)
        out.append(
            FieldProblem(
                "priority", f"unknown priority class '{spec.priority}'; use one of {known}"
            )
        )
    elif pc.teams is not None and spec.team not in pc.teams:
        allowed = ", ".join(p.name for p in config.priority_classes
                            if p.teams is None or spec.team in p.teams)
        out.append(FieldProblem(
            "priority", f"team '{spec.team}' may not use priority class '{pc.name}' (this "
            f"installation allows it to {', '.join(pc.teams) or 'no team'}); use one of "
            f"{allowed}", forbidden=True))
    if spec.gang.replicas > config.limits.max_replicas:
        out.append(
            FieldProblem(
                "gang.replicas",
                f"{spec.gang.replicas} replicas is above this installation's cap of "
                f"{config.limits.max_replicas}",
            )
        )
    if spec.gang.total_gpus > config.limits.max_gpus_per_job:
        out.append(
            FieldProblem(
                "gang",
                f"{spec.gang.total_gpus} GPUs in total is above this installation's cap of "
                f"{config.limits.max_gpus_per_job} per job",
            )
        )
    out += limit_problems(config.limits, spec)
    out += tenancy_problems(config.tenancy, spec)
    out += notify_problems(config.notices, spec)
    team = config.team(spec.team)
    out += [FieldProblem(field, message) for field, message in native_problems(
        team.native if team else None, spec.team, spec.native, list(spec.env),
        config.tenancy.reserved_key_prefixes)]
    return out


def notify_problems(notices: Notices, spec: JobSpec) -> list[FieldProblem]:
    """A job's own webhooks name only hosts `notices.job_webhook_hosts` allows (else any user
    could make the broker call any address it reaches)."""
    if spec.notify is None:
        return []
    allowed = {h.lower() for h in notices.job_webhook_hosts}
    return [FieldProblem(f"notify.webhooks[{i}]",
                         f"host '{webhook_host(url)}' is not in notices.job_webhook_hosts "
                         f"(allowed: {', '.join(sorted(allowed)) or 'none'}); ask an admin, or "
                         "use the team's notices")
            for i, url in enumerate(spec.notify.webhooks) if webhook_host(url) not in allowed]


def tenancy_problems(tenancy: Tenancy, spec: JobSpec) -> list[FieldProblem]:
    """Reserved label and annotation keys, and mounts outside the team's allow-list."""
    out: list[FieldProblem] = []
    for kind, items in (("label", spec.labels), ("annotation", spec.annotations)):
        for key, msg in metadata_keys.reserved_problems(
                kind, items, tenancy.reserved_key_prefixes,
                [*tenancy.exempt_key_prefixes, *metadata_keys.PLATFORM_KEY_PREFIXES]):
            out.append(FieldProblem(f"{kind}s.{key}", msg))
    allowed = tenancy.mounts.get(spec.team, [])
    for i, m in enumerate(spec.mounts):
        if m.name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            out.append(FieldProblem(
                f"mounts[{i}].name",
                f"team '{spec.team}' may not mount '{m.name}' (tenancy.mounts allows: {known})"))
    return out


def limit_problems(limits: Limits, spec: JobSpec) -> list[FieldProblem]:
    """The spec's values above this installation's `limits:` (the spec model itself enforces
    only the hard ceilings)."""
    d, size = format_duration, format_size
    checks: list[tuple[str, int | float | None, int | float, str, Callable[[Any], str]]] = [
        ("max_runtime", spec.max_runtime, limits.max_runtime, "max_runtime", d),
        ("checkpoint.interval", spec.checkpoint.interval, limits.max_runtime, "max_runtime", d),
        ("checkpoint.grace", spec.checkpoint.grace, limits.max_checkpoint_grace,
         "max_checkpoint_grace", d),
        ("retry.backoff", spec.retry.backoff, limits.max_retry_backoff, "max_retry_backoff", d),
        ("retry.max_backoff", spec.retry.max_backoff, limits.max_retry_backoff,
         "max_retry_backoff", d),
        ("retry.max_wasted_gpu_hours", spec.retry.max_wasted_gpu_hours,
         limits.max_wasted_gpu_hours, "max_wasted_gpu_hours", _number),
        ("gang.cpus_per_replica", spec.gang.cpus_per_replica, limits.max_cpus_per_replica,
         "max_cpus_per_replica", str),
        ("gang.memory_per_replica", spec.gang.memory_per_replica,
         limits.max_memory_per_replica, "max_memory_per_replica", size),
    ]
    return [
        FieldProblem(
            field,
            f"{fmt(value)} is above this installation's limit of {fmt(limit)} "
            f"(limits.{key}); ask for at most {fmt(limit)}",
        )
        for field, value, limit, key, fmt in checks
        if value is not None and value > limit
    ]


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def acceptable_flavors(config: IsthmusConfig, spec: JobSpec) -> list[Flavor]:
    """The spec's flavors in preference order, narrowed by its constraints (if any)."""
    if spec.flavors:
        flavors = [f for f in (config.flavor(n) for n in spec.flavors) if f is not None]
    else:
        flavors = sorted(config.flavors, key=lambda f: (f.cost_weight, f.name))
    c = spec.constraints
    if c is None:
        return flavors
    return [
        f
        for f in flavors
        if (c.gpu_model is None or c.gpu_model.lower() in f.gpu_model.lower())
        and (c.min_gpu_memory_gb is None or f.gpu_memory_gb >= c.min_gpu_memory_gb)
        and (c.interconnect is None or (f.interconnect or "").lower() == c.interconnect.lower())
    ]


def candidate_pools(config: IsthmusConfig, spec: JobSpec, flavors: list[Flavor]) -> list[Pool]:
    names = {f.name for f in flavors}
    kinds = {b.name: b.serves_as.value for b in config.backends}
    return [
        p
        for p in config.pools
        if pool_is_candidate(p.flavor, kinds.get(p.backend, ""), names, spec.backend)
    ]


def replicas_per_domain(cap: PoolCapacity, level: TopologyLevel | None, gpus: int,
                        one_per_node: bool = False) -> int:
    """How many replicas of `gpus` GPUs the largest domain at `level` can hold (at most one a
    node for a gang that asks for a node per replica)."""
    per_node = cap.gpus_per_node // gpus
    if one_per_node:
        per_node = min(per_node, 1)
    if level is TopologyLevel.NODE:
        nodes = 1
    elif level is TopologyLevel.RACK:
        nodes = min(cap.nodes, cap.nodes_per_rack or cap.nodes)
    elif level is TopologyLevel.BLOCK:
        per_block = (
            cap.nodes_per_rack * cap.racks_per_block
            if cap.nodes_per_rack and cap.racks_per_block
            else cap.nodes
        )
        nodes = min(cap.nodes, per_block)
    else:
        nodes = cap.nodes
    return per_node * nodes


def _reachable_quota(config: IsthmusConfig, team: Team, flavor: str) -> tuple[int, int]:
    """(nominal, borrowable) GPUs of `flavor` for `team` inside its cohort."""
    own = team.quotas.get(flavor)
    nominal = own.nominal if own else 0
    if team.cohort is None:
        return nominal, 0
    lendable = 0
    for other in config.teams:
        if other.name == team.name or other.cohort != team.cohort:
            continue
        q = other.quotas.get(flavor)
        if q is not None:
            lendable += q.nominal if q.lending_limit is None else min(q.lending_limit, q.nominal)
    limit = own.borrowing_limit if own else 0
    return nominal, lendable if limit is None else min(limit, lendable)


def feasibility(config: IsthmusConfig, spec: JobSpec) -> Verdict:
    flavors = acceptable_flavors(config, spec)
    wanted = ", ".join(spec.flavors) or "flavors matching the constraints"
    if not flavors:
        return Verdict(False, Reason.NoPoolOffersFlavor, f"no configured flavor matches {wanted}")
    pools = candidate_pools(config, spec, flavors)
    if not pools:
        where = "" if spec.backend == "any" else f" on backend kind '{spec.backend}'"
        return Verdict(
            False,
            Reason.NoPoolOffersFlavor,
            f"no pool{where} offers {', '.join(f.name for f in flavors)}",
        )

    if spec.entrypoint.ranks_image:
        runs = {b.name for b in config.backends if b.runs_images}
        if not any(p.backend in runs for p in pools):
            names = ", ".join(sorted(p.name for p in pools))
            return Verdict(
                False,
                Reason.NoPoolRunsImages,
                f"entrypoint.image: the job's ranks run in {spec.entrypoint.ranks_image}, and "
                f"no pool that offers its flavors runs images ({names}: their Slurm backends "
                "have container.runtime none); drop the image to run on the nodes' own "
                "software, or ask an admin for a container runtime",
            )
        pools = [p for p in pools if p.backend in runs]
    too_big = _exceeds_node(spec, pools) or _exceeds_capacity(spec, pools)
    if too_big is not None:
        return too_big
    return _quota_reach(config, spec, flavors, pools)


def _exceeds_node(spec: JobSpec, pools: list[Pool]) -> Verdict | None:
    """When every candidate pool declares its nodes' CPUs (or memory): a replica must fit the
    largest node of one of them. (Pools that declare none are judged at admission, from the
    nodes their backend reports: the job then waits, told which node is the largest.)"""
    gang = spec.gang
    asks: list[tuple[str, int | None, Callable[[PoolCapacity], int | None], Callable[[int], str]]]
    asks = [("CPUs", gang.cpus_per_replica, lambda c: c.cpus_per_node, str),
            ("of memory", gang.memory_per_replica, lambda c: c.memory_per_node, format_size)]
    for what, need, size_of, fmt in asks:
        sizes = [(size_of(p.capacity), p.name) for p in pools if p.capacity is not None]
        if not need or len(sizes) != len(pools) or any(n is None for n, _ in sizes):
            continue
        largest, pool = max((int(n or 0), name) for n, name in sizes)
        if need > largest:
            field = "cpus_per_replica" if what == "CPUs" else "memory_per_replica"
            return Verdict(
                False, Reason.ExceedsCapacity,
                f"gang.{field}: each replica needs {fmt(need)} {what}, and the largest node "
                f"of an acceptable pool (pool {pool}) has {fmt(largest)}; ask for at most "
                f"{fmt(largest)} per replica, or spread the work over more replicas")
    return None


def _exceeds_capacity(spec: JobSpec, pools: list[Pool]) -> Verdict | None:
    """When every candidate pool declares its shape: the gang must fit the largest domain
    at its required level of one of them, even empty."""
    gang = spec.gang
    level = spec.topology.required
    sized = [(p, p.capacity) for p in pools if p.capacity is not None]
    if sized and len(sized) == len(pools):
        best_pool, best = max(
            ((p, replicas_per_domain(c, level, gang.gpus_per_replica, gang.one_per_node))
             for p, c in sized),
            key=lambda pb: (pb[1], pb[0].name),
        )
        if best < gang.replicas:
            cap = best_pool.capacity
            assert cap is not None
            within = f"within one {level.value}" if level else "in one pool"
            if cap.gpus_per_node < gang.gpus_per_replica:
                detail = (
                    f"each replica needs {gang.gpus_per_replica} GPUs and the largest node of an "
                    f"acceptable pool has {cap.gpus_per_node}"
                )
            else:
                short = gang.replicas - best
                detail = (
                    f"the largest such domain (pool {best_pool.name}) holds {best} replicas; "
                    f"short by {short} replicas ({short * gang.gpus_per_replica} GPUs)"
                )
            return Verdict(
                False,
                Reason.ExceedsCapacity,
                f"needs {gang.replicas} x {gang.gpus_per_replica} GPUs {within}; {detail}",
            )
    return None


def _quota_reach(config: IsthmusConfig, spec: JobSpec, flavors: list[Flavor],
                 pools: list[Pool]) -> Verdict:
    """The job must fit the most quota its team can reach in some offered flavor (its own
    nominal plus what its cohort may lend)."""
    gang = spec.gang
    team = config.team(spec.team)
    assert team is not None, "request_problems rejects unknown teams first"
    offered = {p.flavor for p in pools}
    best_reach, best_note = -1, ""
    for f in flavors:
        if f.name not in offered:
            continue
        nominal, borrow = _reachable_quota(config, team, f.name)
        if nominal + borrow > best_reach:
            best_reach = nominal + borrow
            best_note = f"{f.name}: nominal {nominal} + borrowable {borrow}"
    if best_reach < gang.total_gpus:
        cohort = f" in cohort {team.cohort}" if team.cohort else ""
        return Verdict(
            False,
            Reason.NoQuotaInCohort,
            f"needs {gang.total_gpus} GPUs; the most team {team.name} can reach{cohort} is "
            f"{best_reach} ({best_note}), short by {gang.total_gpus - best_reach}",
        )
    return Verdict(True, Reason.WaitingForAdmission, "valid; waiting for the next admission cycle")
