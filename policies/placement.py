"""Gang placement: all-or-nothing fit of one job in the tightest topology domain, scored across
pools, with a verdict (and a reason) kept for every candidate pool.

Checks per candidate pool, in order (the first that fails gives the pool's verdict):
  backend unreachable (or the pool marked unavailable) -> BackendUnavailable, with the pool's
  note (which backend, the error, since when); drained -> PoolDrained; a job naming an image on
  a pool whose backend runs none -> ImageUnsupported; excluded for this job
  after failures -> PoolExcluded; flavor blocked by quota -> the quota reason; a replica larger
  than any node, or a gang larger than any domain at the required level even when empty ->
  TopologyUnsatisfiable; not enough free GPUs -> InsufficientCapacity; enough GPUs but no
  domain at the required level holds the gang now -> TopologyUnsatisfiable.
A pool that fails only for lack of free capacity can still be a candidate by queueing in the
backend when it is shared and fewer than its `max_isthmus_pending` Isthmus jobs wait there.

Score (lower is better): flavor preference rank, topology level reached (node < rack < block <
pool) plus a penalty when a `preferred` level is missed, expected wait from the pool's queue
depth (for a gang that fits now: the backend's own backlog of jobs that are not Isthmus's,
which its scheduler may serve first), fragmentation left in the chosen domain, and the pool's
cost weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from broker.domain.attempts import Placement
from broker.domain.inventory import pool_is_candidate
from broker.domain.reasons import Reason, most_severe, severity
from broker.domain.spec import BackendKind
from broker.domain.topology import LEVEL_NAMES, LEVELS, NODE, POOL, TopologyLevel, rank_of
from policies import queue_guard
from policies.capacity import (
    CapacityIndex,
    Fit,
    NodeCap,
    NodeSlot,
    PoolIndex,
)
from policies.types import PendingJob


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    flavor: float = 1.0
    """Per step down the job's flavor preference list."""
    topology: float = 0.25
    """Per level looser than a single node."""
    preferred_miss: float = 0.5
    wait_per_hour: float = 1.0
    fragmentation: float = 0.5
    """Times the share of the chosen domain left free (0: perfect fit)."""
    cost: float = 0.1
    """Times the pool's cost weight."""
    queued: float = 1.0
    """Penalty for waiting in a backend queue instead of starting now: the wait is an estimate
    and the job is bound to that pool until it starts."""
    foreign_wait: float = 1.0
    """Per hour of the backend's own backlog (jobs not Isthmus's) in a pool the gang fits in:
    the backend's scheduler may give the free GPUs to that backlog first, so of two fitting
    pools the one with the longer foreign queue is the worse bet."""


@dataclass(frozen=True, slots=True)
class PlacementParams:
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    turnover_seconds: float = 3600.0
    """Turns queue depth into an expected wait when the backend gives no estimate: pending
    GPUs / pool GPUs x turnover."""
    default_max_isthmus_pending: int = 0
    """Cap for pools whose snapshot leaves `max_isthmus_pending` unset; 0 never queues."""
    queue_max_gpus: int = 8
    """Larger gangs never wait in a backend queue: there a stream of small jobs can starve
    them, while waiting in Isthmus they get a topology-aware reservation."""
    hold_queued_by_shape: bool = False
    """Hold free GPUs for Isthmus jobs queued in a backend only where their gangs can start,
    when the backend reports their shapes (policies/backlog.py); off: all their GPUs."""


@dataclass(frozen=True, slots=True)
class PoolVerdict:
    pool: str
    flavor: str
    backend: str
    backend_kind: BackendKind
    fits: bool
    reason: Reason
    message: str
    score: float | None = None
    level: TopologyLevel | None = None
    domain: str | None = None
    queued: bool = False
    """Fits only by waiting in the backend's own queue."""
    expected_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PlacementResult:
    job_id: str
    placement: Placement | None
    reason: Reason
    message: str
    verdicts: tuple[PoolVerdict, ...]
    fit: Fit | None = field(default=None, compare=False, repr=False)
    """Handle into the working copy, used by admission to allocate; None when queued."""

    @property
    def queued(self) -> bool:
        return self.placement is not None and self.fit is None


def max_level(job: PendingJob) -> int:
    return rank_of(job.topology_required)


def expected_wait(pool: PoolIndex, params: PlacementParams) -> float:
    q = pool.snap.queue
    if q.expected_wait_seconds is not None:
        return q.expected_wait_seconds
    return q.pending_gpus / max(1, pool.total) * params.turnover_seconds


def foreign_wait(pool: PoolIndex, params: PlacementParams) -> float:
    """Seconds the backend's own backlog (not Isthmus's jobs) takes to drain from the pool."""
    return pool.snap.queue.foreign_pending_gpus / max(1, pool.total) * params.turnover_seconds


def queue_cap(pool: PoolIndex, params: PlacementParams) -> int:
    cap = pool.snap.max_isthmus_pending
    return params.default_max_isthmus_pending if cap is None else cap


def _node_cap(job: PendingJob, pool: PoolIndex) -> NodeCap | None:
    """None when the bucket index can answer; otherwise a per-node capacity function."""
    g = job.gpus_per_replica
    ex = job.exclude_nodes
    c = job.cpus_per_replica
    m = job.memory_per_replica
    one = job.one_per_node
    if not c and not m and not one and not (ex and not ex.isdisjoint(pool.nodes)):
        return None

    def cap(n: NodeSlot) -> int:
        if n.name in ex:
            return 0
        k = n.free // g
        if one:  # sbatch -N: replicas on distinct nodes
            k = min(k, 1)
        if c and n.free_cpus is not None:
            k = min(k, n.free_cpus // c)
        if m and n.free_mem is not None:
            k = min(k, n.free_mem // m)
        return k

    return cap


def _verdict(pool: PoolIndex, reason: Reason, message: str, *, fits: bool = False,
             **found: Any) -> PoolVerdict:
    """A pool's verdict; `found` holds the fields of a fitting one (score, level, ...)."""
    snap = pool.snap
    return PoolVerdict(pool=snap.name, flavor=snap.flavor, backend=snap.backend,
                       backend_kind=snap.backend_kind, fits=fits, reason=reason,
                       message=message, **found)


def evaluate_pool(
    job: PendingJob,
    pool: PoolIndex,
    index: CapacityIndex,
    params: PlacementParams,
    blocked: Mapping[str, tuple[Reason, str]] | None = None,
) -> tuple[PoolVerdict, Fit | None]:
    """The verdict of one candidate pool for one job (see the module docstring for order).
    A pool served from its backend's last inventory says so in its verdict's message."""
    s = pool.snap
    if s.unavailable or s.backend in index.unreachable:
        why = s.unavailable or f"backend {s.backend} unreachable"
        return _verdict(pool, Reason.BackendUnavailable, why), None
    verdict, fit = _evaluate(job, pool, params, blocked)
    if s.stale:
        verdict = replace(verdict, message=f"{verdict.message} ({s.stale})")
    return verdict, fit


def _replica_too_big(job: PendingJob, pool: PoolIndex) -> str | None:
    """A replica asking for more CPUs or memory than the pool's largest node has never fits
    there; saying so beats "no 1 x 8 GPUs fit within the free nodes now"."""
    c, m = job.cpus_per_replica, job.memory_per_replica
    if c and pool.max_node_cpus and c > pool.max_node_cpus:
        return (f"a replica needs {c} CPUs; the largest node of {pool.snap.name} has "
                f"{pool.max_node_cpus}")
    if m and pool.max_node_memory and m > pool.max_node_memory:
        return (f"a replica needs {m / 2**30:.1f} GiB of memory; the largest node of "
                f"{pool.snap.name} has {pool.max_node_memory / 2**30:.1f} GiB")
    return None


def _evaluate(
    job: PendingJob,
    pool: PoolIndex,
    params: PlacementParams,
    blocked: Mapping[str, tuple[Reason, str]] | None,
) -> tuple[PoolVerdict, Fit | None]:
    refused = _refusal(job, pool, blocked)
    if refused is not None:
        return refused, None
    top = max_level(job)
    fit = pool.find(job.gpus_per_replica, job.replicas, top, _node_cap(job, pool))
    if fit is not None:
        return _fits_now(job, pool, fit, params), fit
    reason, msg = _short_now(job, pool, top)
    return _queued(job, pool, params, reason, msg), None


def _refusal(job: PendingJob, pool: PoolIndex,
             blocked: Mapping[str, tuple[Reason, str]] | None) -> PoolVerdict | None:
    """Why the pool can never serve the job (drained, excluded, quota, shape), or None."""
    s = pool.snap
    if s.drained:
        return _verdict(pool, Reason.PoolDrained, f"pool {s.name} is drained")
    if job.image and not s.runs_images:
        msg = (f"pool {s.name} cannot run images (its backend {s.backend} has no container "
               f"runtime) and the job names {job.image}")
        return _verdict(pool, Reason.ImageUnsupported, msg)
    if s.name in job.exclude_pools:
        msg = f"pool {s.name} excluded for this job after a failure there"
        return _verdict(pool, Reason.PoolExcluded, msg)
    if blocked and s.flavor in blocked:
        reason, msg = blocked[s.flavor]
        return _verdict(pool, reason, msg)
    g, r = job.gpus_per_replica, job.replicas
    if g > pool.max_node_total:
        msg = f"a replica needs {g} GPUs; the largest node of {s.name} has {pool.max_node_total}"
        return _verdict(pool, Reason.TopologyUnsatisfiable, msg)
    too_big = _replica_too_big(job, pool)
    if too_big:
        return _verdict(pool, Reason.TopologyUnsatisfiable, too_big)
    top = max_level(job)
    if job.one_per_node and r > 1 and top == NODE:
        return _verdict(pool, Reason.TopologyUnsatisfiable,
                        f"{r} replicas on a node each cannot all be within one node")
    if job.one_per_node and r > len(pool.nodes):
        return _verdict(pool, Reason.TopologyUnsatisfiable,
                        f"{r} replicas on a node each; {s.name} has {len(pool.nodes)} nodes")
    if pool.static_cap(g, top) < r:
        within = f"one {LEVEL_NAMES[top]}" if top < POOL else "the pool"
        msg = (
            f"needs {r} x {g} GPUs within {within}; even when empty the largest holds "
            f"{pool.static_cap(g, top)} replicas"
        )
        return _verdict(pool, Reason.TopologyUnsatisfiable, msg)
    return None


def _flavor_rank(job: PendingJob, flavor: str) -> int:
    return job.flavors.index(flavor) if flavor in job.flavors else len(job.flavors)


def _fits_now(job: PendingJob, pool: PoolIndex, fit: Fit, params: PlacementParams
              ) -> PoolVerdict:
    """The verdict of a pool the gang fits in now, scored (lower is better)."""
    s, w = pool.snap, params.weights
    need = job.gpus_per_replica * job.replicas
    pref = job.topology_preferred
    frag = fit.leftover / (fit.leftover + need)
    score = (
        w.flavor * _flavor_rank(job, s.flavor)
        + w.topology * fit.level
        + (w.preferred_miss if pref is not None and fit.level > pref.rank else 0.0)
        + w.fragmentation * frag
        + w.cost * s.cost_weight
        + w.foreign_wait * foreign_wait(pool, params) / 3600.0
    )
    where = f"{LEVEL_NAMES[fit.level]} {fit.domain}" if fit.level < POOL else "the pool"
    msg = f"fits in {where} on {len(fit.nodes)} node(s), {fit.leftover} GPUs left there"
    return _verdict(pool, Reason.Admitted, msg, fits=True, score=round(score, 6),
                    level=LEVELS[fit.level], domain=fit.domain)


def _short_now(job: PendingJob, pool: PoolIndex, top: int) -> tuple[Reason, str]:
    """Why the gang does not fit now: too few free GPUs, or free ones in the wrong places."""
    g, r = job.gpus_per_replica, job.replicas
    need = g * r
    if pool.free < need:
        unsched = f", {pool.unschedulable} node(s) unschedulable" if pool.unschedulable else ""
        if pool.backlog_held:
            unsched += f", {pool.backlog_held} more held for Isthmus jobs queued in the backend"
        return (Reason.InsufficientCapacity,
                f"needs {need} GPUs; {pool.free} of {pool.total} free{unsched}")
    within = f"one {LEVEL_NAMES[top]}" if top < POOL else "the free nodes"
    return (Reason.TopologyUnsatisfiable,
            f"{pool.free} GPUs free but no {r} x {g} GPUs fit within {within} now")


def _queued(job: PendingJob, pool: PoolIndex, params: PlacementParams, reason: Reason,
            msg: str) -> PoolVerdict:
    """A small job that does not fit now may wait in a shared pool's backend queue, while
    that queue holds fewer Isthmus jobs than its cap and a starving gang's hold in the pool
    allows it (kept off the held nodes, or the queue closed: policies/queue_guard.py); else
    the pool is refused."""
    s, w = pool.snap, params.weights
    need = job.gpus_per_replica * job.replicas
    limit = queue_cap(pool, params)
    small = s.shared and need <= params.queue_max_gpus
    if small and limit and (why := queue_guard.refusal(pool, job, max_level(job))):
        return _verdict(pool, reason, f"{msg}; {why}")
    if small and pool.queued < limit:
        wait = expected_wait(pool, params) + need / max(1, pool.total) * params.turnover_seconds
        score = (w.queued + w.flavor * _flavor_rank(job, s.flavor)
                 + w.wait_per_hour * wait / 3600.0 + w.cost * s.cost_weight)
        qmsg = (
            f"{msg}; may wait in the backend queue (~{wait / 60:.0f} min expected, "
            f"{pool.queued} of {limit} Isthmus jobs pending there{queue_guard.note(pool, job)})"
        )
        return _verdict(pool, Reason.BackendPending, qmsg, fits=True, score=round(score, 6),
                        level=job.topology_required, queued=True, expected_wait_s=wait)
    if small and limit:
        msg = f"{msg}; backend queue full ({pool.queued} of {limit} Isthmus jobs pending)"
    return _verdict(pool, reason, msg)


def candidate_pools(job: PendingJob, index: CapacityIndex) -> list[PoolIndex]:
    flavors = set(job.flavors)
    return [
        p
        for name in index.order
        if pool_is_candidate((p := index.pools[name]).flavor, p.snap.backend_kind.value,
                             flavors, job.backend)
    ]


def verdict_order(v: PoolVerdict) -> tuple[int, float, int, str]:
    """Fitting pools by score, then refused pools from the most severe reason; names last."""
    if v.fits:
        return (0, v.score or 0.0, 0, v.pool)
    return (1, 0.0, -severity(v.reason), v.pool)


def place(
    job: PendingJob,
    index: CapacityIndex,
    params: PlacementParams | None = None,
    blocked: Mapping[str, tuple[Reason, str]] | None = None,
    pools: list[PoolIndex] | None = None,
) -> PlacementResult:
    """Choose a pool and nodes for `job` on the working copy `index` (which is not changed:
    call `commit` to allocate). `blocked` maps flavors refused by quota to (reason, message)."""
    params = params or PlacementParams()
    cands = candidate_pools(job, index) if pools is None else pools
    if not cands:
        wanted = ", ".join(job.flavors) or "(none)"
        on = "" if job.backend == "any" else f" on {job.backend}"
        msg = f"no pool{on} currently offers {wanted}"
        return PlacementResult(job.id, None, Reason.NoFlavorFits, msg, ())
    verdicts: list[PoolVerdict] = []
    fits: dict[str, Fit | None] = {}
    for pool in cands:
        v, fit = evaluate_pool(job, pool, index, params, blocked)
        verdicts.append(v)
        if v.fits:
            fits[v.pool] = fit
    verdicts.sort(key=verdict_order)
    best = verdicts[0]
    if not best.fits:
        worst = most_severe(v.reason for v in verdicts) or Reason.InsufficientCapacity
        first = next(v for v in verdicts if v.reason is worst)
        return PlacementResult(
            job.id, None, worst, f"{first.pool}: {first.message}", tuple(verdicts)
        )
    fit = fits[best.pool]
    pool = index.pools[best.pool]
    nodes: tuple[str, ...] = ()
    if fit is not None:
        nodes = tuple(n.name for n, k in fit.nodes for _ in range(k))
    placement = Placement(
        backend=pool.snap.backend_kind,
        backend_instance=pool.snap.backend,
        pool=pool.name,
        flavor=pool.flavor,
        topology_level=best.level,
        topology_domain=best.domain or None,
        nodes=nodes,
        exclude_nodes=queue_guard.excluded(pool, job) if fit is None else (),
    )
    reason = Reason.BackendPending if fit is None else Reason.Admitted
    return PlacementResult(
        job.id, placement, reason, f"{best.pool}: {best.message}", tuple(verdicts), fit
    )


def commit(job: PendingJob, result: PlacementResult, index: CapacityIndex) -> None:
    """Allocate the chosen placement in the working copy (or count a backend-queued job)."""
    if result.placement is None:
        return
    pool = index.pools[result.placement.pool]
    if result.fit is None:
        pool.queued += 1
    else:
        pool.allocate(
            result.fit, job.gpus_per_replica, job.cpus_per_replica, job.memory_per_replica
        )
    pool.admitted += 1
    if pool.admitted_max_priority is None or job.priority > pool.admitted_max_priority:
        pool.admitted_max_priority = job.priority
