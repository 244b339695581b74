"""Queue position and estimated start of every waiting job of one admission cycle.

A shadow schedule, as a batch scheduler's backfill estimate does it: each pool's nodes are
replayed forward in time from what the backends say (free GPUs now, and when busy GPUs come
back: `NodeSnapshot.releases`, from declared time limits), the jobs admitted this cycle hold
their nodes for their declared `max_runtime`, GPUs owed to work queued in a backend are held
next (as admission holds them), a starving gang's reservation holds the free GPUs of its nodes
until it starts, and the waiting jobs, in the cycle's admission
order, each take the earliest time at which their gang fits for its whole declared run in one
domain at its required topology level, which then holds those GPUs for later jobs. A later job
may start before an earlier one where it fits in a gap (backfill), never by delaying it.

Methods (`Estimate.method`), named so a user knows what the time rests on:
  now            the gang fits now; it waits only for the next cycle (or its backend queue)
  releases       from the expected releases of running work and the declared run times of
                 the jobs ahead
  preemption     its victims are being stopped; it starts once they have
  unknown        no estimate; the method says why (quota, drained or unavailable pools, no
                 release data for busy GPUs, beyond the horizon)

Pure: the same cycle result and snapshot give the same estimates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from broker.domain.inventory import InventorySnapshot, NodeSnapshot
from broker.domain.reasons import Reason
from broker.domain.spec import TopologyLevel
from policies.admission import Decision
from policies.types import PendingJob

MAX_ESTIMATED = 500
"""Jobs past this place in the queue get no estimate: the replay is linear in the queue."""
MAX_WORK = 200_000
"""Node checks one estimate pass may make (deterministic, unlike a time budget); jobs after
it is spent get no estimate. Bounds a pass at about a second on a 10,000-job queue."""
MAX_STARTS = 64
"""Start times tried per job and pool (each expected release is one): a gang that needs more
releases than this before it fits gets no date."""
HORIZON_S = 60 * 86400
"""Starts further away than this are reported as unknown rather than as a date."""
_SCHEDULABLE = frozenset({
    Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable, Reason.HigherPriorityAhead,
    Reason.FairShareBehind, Reason.WaitingForAdmission, Reason.BackoffAfterFailure,
})
"""Decision reasons for which capacity alone decides when the job starts."""
_POOL_USABLE = frozenset({Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable})


@dataclass(frozen=True, slots=True)
class Estimate:
    job_id: str
    position: int
    """1-based place among the waiting jobs, in admission order (0: not ordered, in backoff)."""
    team_position: int
    """1-based place among its team's waiting jobs."""
    at: datetime | None
    """Earliest estimated start; None when not known (see `method`)."""
    method: str
    pool: str | None = None
    nodes: tuple[str, ...] = ()
    """The nodes the replay gave it in `pool`, one entry per replica (empty without a date)."""


@dataclass(slots=True)
class _Node:
    name: str
    total: int
    free: int
    domains: tuple[str, str, str, str]
    """Its domain at node, rack, block and pool level."""
    times: list[float] = field(default_factory=list)
    deltas: list[int] = field(default_factory=list)

    def add(self, t: float, delta: int) -> None:
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.deltas.insert(i, delta)

    def room(self, t0: float, t1: float) -> int:
        """Least free GPUs over [t0, t1), never above the node's total."""
        if not self.times:
            return min(self.free, self.total)
        i = bisect.bisect_right(self.times, t0)
        level = self.free + sum(self.deltas[:i])
        low = min(level, self.total)
        for d in self.deltas[i:bisect.bisect_left(self.times, t1, i)]:
            level += d
            if level < low:
                low = level
        return max(0, low)


_LEVEL = {TopologyLevel.NODE: 0, TopologyLevel.RACK: 1, TopologyLevel.BLOCK: 2, None: 3}


class _Pool:
    def __init__(self, nodes: Sequence[NodeSnapshot], now: float, factor: float) -> None:
        self.nodes: dict[str, _Node] = {}
        self.unknown_busy = False
        self._ups: list[float] | None = None
        self._live: list[_Node] | None = None
        for n in nodes:
            if not n.schedulable or n.total_gpus <= 0:
                continue
            t = n.topology
            node = _Node(n.name, n.total_gpus, min(n.free_gpus, n.total_gpus),
                         (n.name, f"{t.block}/{t.rack}", t.block or "", ""))
            released = 0
            for at, gpus in n.releases:
                if gpus > 0:
                    node.add(now + factor * max(0.0, at.timestamp() - now), gpus)
                    released += gpus
            if node.free + released < node.total:
                self.unknown_busy = True  # some busy GPUs have no announced end
            self.nodes[n.name] = node

    def starts(self, now: float) -> list[float]:
        """`now`, then every time GPUs come back after it (cached until the next take)."""
        if self._ups is None:
            ups: set[float] = set()
            for n in self.nodes.values():
                ups.update(t for t, d in zip(n.times, n.deltas, strict=True) if d > 0)
            self._ups = sorted(ups)
        return [now, *self._ups[bisect.bisect_right(self._ups, now):]]

    def earliest(
        self, now: float, g: int, replicas: int, level: int, run_s: float,
        exclude: frozenset[str], work: list[int],
    ) -> tuple[float, list[tuple[_Node, int]]] | None:
        for t in self.starts(now)[:MAX_STARTS]:
            if t - now > HORIZON_S or work[0] <= 0:
                return None
            live = self.live()
            work[0] -= len(live)
            groups: dict[str, list[tuple[_Node, int]]] = {}
            for n in live:
                if n.name in exclude:
                    continue
                k = n.room(t, t + run_s) // g
                if k:
                    groups.setdefault(n.domains[level], []).append((n, k))
            for domain in sorted(groups):
                members = groups[domain]
                if sum(k for _, k in members) < replicas:
                    continue
                picked: list[tuple[_Node, int]] = []
                need = replicas
                for n, k in sorted(members, key=lambda m: (-m[1], m[0].name)):
                    take = min(k, need)
                    picked.append((n, take))
                    need -= take
                    if not need:
                        break
                return t, picked
        return None

    def live(self) -> list[_Node]:
        """Nodes that have or will have free GPUs: a full node with no known release never
        does, and most nodes of a busy pool are such."""
        if self._live is None:
            self._live = [n for n in self.nodes.values() if n.free > 0 or n.times]
        return self._live

    def hold(self, now: float, t: float, g: int, picked: list[tuple[_Node, int]]) -> None:
        """A starving gang's reservation (policies.admission holds the free GPUs of its
        domain until it starts): what is free on its nodes until its start is not for others."""
        self._ups = self._live = None
        for n, k in picked:
            held = min(k * g, n.room(now, t))
            if held > 0:
                n.add(now, -held)
                n.add(t, held)

    def hold_owed(self, now: float, gpus: int, run_s: float, work: list[int]) -> None:
        """`gpus` GPUs for work queued in the backend: the free ones now first (as admission
        holds them), the rest from the earliest releases, each held for `run_s`."""
        picked: list[tuple[_Node, int]] = []
        left = gpus
        for n in sorted(self.live(), key=lambda n: (-n.free, n.name)):
            k = min(left, n.room(now, now + run_s))
            if k > 0:
                picked.append((n, k))
                left -= k
            if not left:
                break
        if picked:
            self.take(now, run_s, 1, picked)
        if left:
            found = self.earliest(now, 1, left, 3, run_s, frozenset(), work)
            if found is not None:
                self.take(found[0], run_s, 1, found[1])

    def take(self, t: float, run_s: float, g: int, picked: list[tuple[_Node, int]]) -> None:
        self._ups = self._live = None
        for n, k in picked:
            n.add(t, -k * g)
            n.add(t + run_s, k * g)


def _ts(at: datetime) -> float:
    return at.timestamp()


def estimate(
    decisions: Sequence[Decision],
    jobs: Mapping[str, PendingJob],
    inventory: InventorySnapshot,
    now: datetime,
    max_estimated: int = MAX_ESTIMATED,
    runtime_factor: float = 1.0,
) -> dict[str, Estimate]:
    """Position and estimated start of every waiting decision (admitted ones get none).

    `runtime_factor` scales declared run times and the time left until announced releases:
    1.0 trusts the declared limits; the broker passes the ratio of true to declared run time
    observed on ended attempts (declared limits are over-estimates, see backends/sim/trace.py),
    and names it in the method."""
    t_now = _ts(now)
    f = min(1.0, max(0.01, runtime_factor))
    pools = {p.name: _Pool(p.nodes, t_now, f) for p in inventory.pools}
    # 1 the admitted jobs of this cycle hold their nodes for their declared run
    for d in decisions:
        if not (d.admitted and d.placement and d.placement.nodes) or d.job_id not in jobs:
            continue
        pool = pools.get(d.placement.pool)
        admitted = jobs[d.job_id]
        if pool is None:
            continue
        for name in d.placement.nodes:  # one entry per replica
            node = pool.nodes.get(name)
            if node is not None:
                node.add(t_now - 1e-6, -admitted.gpus_per_replica)
                node.add(t_now + f * admitted.max_runtime_s, admitted.gpus_per_replica)
    ctx = _Pass([MAX_WORK], {})
    # 2 work queued in the backends goes first (admission holds free GPUs for it too)
    _backend_queues(decisions, jobs, inventory, pools, t_now, f, ctx)
    # 3 the waiting jobs in admission order (backoff ones, unordered, last)
    waiting = [d for d in decisions if not d.admitted]
    waiting.sort(key=lambda d: (d.position < 0, d.position))
    out: dict[str, Estimate] = {}
    per_team: dict[str, int] = {}
    for i, d in enumerate(waiting, start=1):
        job = jobs.get(d.job_id)
        team = job.team if job else ""
        per_team[team] = per_team.get(team, 0) + 1
        position = i if d.position >= 0 else 0
        at, method, where, nodes = _one(d, job, pools, t_now, i > max_estimated, f, ctx)
        out[d.job_id] = Estimate(d.job_id, position, per_team[team], at, method, where, nodes)
    return out


def _backend_queues(
    decisions: Sequence[Decision], jobs: Mapping[str, PendingJob], inventory: InventorySnapshot,
    pools: dict[str, _Pool], now: float, factor: float, ctx: _Pass,
) -> None:
    """GPUs owed to jobs in a pool's backend queue (the Isthmus GPUs the backend has pending,
    and the jobs admitted to its queue this cycle, with no nodes yet) are taken before any
    waiting job: admission holds the free GPUs for them, and the backend starts them first.
    They are known by their GPUs only: held from now where free, else from the first releases,
    for the median declared run of this cycle's jobs."""
    runs = sorted(j.max_runtime_s for j in jobs.values())
    run_s = max(1.0, factor * (runs[len(runs) // 2] if runs else 3600.0))
    owed = {snap.name: snap.queue.isthmus_pending_gpus for snap in inventory.pools}
    for d in decisions:
        job = jobs.get(d.job_id)
        if d.admitted and d.placement and not d.placement.nodes and job is not None:
            owed[d.placement.pool] = owed.get(d.placement.pool, 0) + job.total_gpus
    for name, gpus in sorted(owed.items()):
        pool = pools.get(name)
        if gpus > 0 and pool is not None:
            pool.hold_owed(now, gpus, run_s, ctx.work)


@dataclass(slots=True)
class _Pass:
    work: list[int]
    """Node checks left (a list so that pools can spend it)."""
    never: dict[tuple[str, int, int, int], float]
    """(pool, GPUs per replica, replicas, level) -> shortest run that found no start: pools
    only fill up as the pass goes on, so a gang that fits nowhere fits nowhere later either."""


def _one(
    d: Decision, job: PendingJob | None, pools: dict[str, _Pool], now: float, beyond: bool,
    factor: float, ctx: _Pass,
) -> tuple[datetime | None, str, str | None, tuple[str, ...]]:
    if job is None:
        return None, "unknown: no admission view", None, ()
    if d.reason == Reason.WaitingForPreemption:
        return _dt(now), "preemption", None, ()
    if d.reason not in _SCHEDULABLE:
        return None, f"unknown: waits for {d.reason.value}, not for capacity", None, ()
    if beyond:
        return None, f"unknown: beyond the first {MAX_ESTIMATED} jobs of the queue", None, ()
    start = now
    if job.not_before is not None:
        start = max(start, _ts(job.not_before))
    usable = [v.pool for v in d.verdicts if (v.fits or v.reason in _POOL_USABLE)]
    run_s = max(1.0, factor * job.max_runtime_s)
    level = _LEVEL.get(job.topology_required, 3)
    best: tuple[float, str, list[tuple[_Node, int]]] | None = None
    blind = False
    for name in sorted(usable):
        pool = pools.get(name)
        if pool is None:
            continue
        key = (name, job.gpus_per_replica, job.replicas, level)
        if not job.exclude_nodes and start == now and ctx.never.get(key, math.inf) <= run_s:
            blind = blind or pool.unknown_busy
            continue
        found = pool.earliest(start, job.gpus_per_replica, job.replicas, level, run_s,
                              job.exclude_nodes, ctx.work)
        if found is None:
            if ctx.work[0] <= 0:
                return None, "unknown: the estimate's work budget for this cycle is spent", None, ()
            if not job.exclude_nodes and start == now:
                ctx.never[key] = min(run_s, ctx.never.get(key, math.inf))
            blind = blind or pool.unknown_busy
            continue
        if best is None or found[0] < best[0]:
            best = (found[0], name, found[1])
    if best is None:
        why = ("busy GPUs without a known end" if blind
               else f"no fit within {HORIZON_S // 86400} days")
        return None, f"unknown: {why}", None, ()
    t, name, picked = best
    pools[name].take(t, run_s, job.gpus_per_replica, picked)
    if d.reservation is not None and t > now:
        pools[name].hold(now, t, job.gpus_per_replica, picked)
    nodes = tuple(n.name for n, k in picked for _ in range(k))
    if t <= now:
        return _dt(t), "now", name, nodes
    scaled = "" if factor == 1.0 else f" x{factor:.2f} (observed run/declared)"
    return _dt(t), f"releases{scaled}", name, nodes


def _dt(t: float) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=t)
