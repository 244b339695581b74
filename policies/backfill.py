"""Conservative backfill into capacity held for starving gangs (Slurm's backfill rule). Pure.

A starving gang that does not fit holds the free GPUs of one domain (policies/cycle.py,
`_reserve`) until it fits there: its expected start `ready`, the earliest time its replicas fit
on those nodes counting the GPUs each node has back by then (`NodeSnapshot.releases`, from
declared time limits; policies/reservation.py). A later job of the same cycle that does not fit
elsewhere may use held GPUs when doing so does not delay that start: with the job's GPUs given
back only at the end of its declared limit (`max_runtime_s`, bounded by the spec) plus a
margin for the backends' slack past it (`OrderingParams.backfill_margin_s`), the gang
must still fit on those nodes by `ready`. A job whose limit ends before `ready` always passes;
one that ends later passes only where the domain has room to spare at `ready`. A hold whose
start is unknown (no release data: `ready` infinite) lends nothing, and neither does one the
gang could already use now.

Held GPUs are already out of the working copy's free counts; a backfilled job takes its
node's free GPUs first, then held ones, so free counts only ever shrink inside a cycle (the
capacity index's failure memo relies on that).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from broker.domain.attempts import Placement
from broker.domain.topology import LEVELS
from policies.capacity import NodeSlot, PoolIndex, domain_name
from policies.placement import max_level
from policies.reservation import fit_time
from policies.types import PendingJob


@dataclass(slots=True)
class Held:
    """The GPUs one starving gang's reservation holds in one domain this cycle."""

    job_id: str
    domain: str
    g: int
    replicas: int
    ready: float
    """When the gang fits there (POSIX seconds), by declared limits."""
    nodes: list[NodeSlot]
    held: dict[str, int]
    """GPUs held per node and not lent."""
    returns: dict[str, list[tuple[datetime, int]]] = field(default_factory=dict)
    """GPUs lent per node, with the end of the borrower's declared limit."""
    claimed: frozenset[str] = frozenset()
    """Nodes whose releases earlier holds of the pool had claimed when `ready` was computed
    (`PoolIndex.claimed`): they do not count for this gang, as they did not for `ready`."""

    def ready_if(self, lend: dict[str, int], end: datetime) -> float:
        """The gang's start if `lend` GPUs per node were lent until `end`. GPUs lent from
        this hold come back to it even on claimed nodes; other releases there do not."""
        view = [_View(n, self.held.get(n.name, 0) - lend.get(n.name, 0),
                      (*(() if n.name in self.claimed else n.releases),
                       *self.returns.get(n.name, ()),
                       *(((end, lend[n.name]),) if lend.get(n.name) else ())))
                for n in self.nodes]
        return fit_time(view, self.g, self.replicas)

    def lend(self, lend: dict[str, int], end: datetime) -> None:
        for name, gpus in lend.items():
            self.held[name] -= gpus
            self.returns.setdefault(name, []).append((end, gpus))


@dataclass(frozen=True, slots=True)
class _View:
    """A node as the gang would find it: only held GPUs count as free now."""

    node: NodeSlot
    free: int
    releases: tuple[tuple[datetime, int], ...]

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def total(self) -> int:
        return self.node.total


def lends(held: Held) -> bool:
    """A hold lends only when the gang's start is known and still to come."""
    return math.isfinite(held.ready) and held.ready > -math.inf


@dataclass(frozen=True, slots=True)
class Backfill:
    placement: Placement
    held: Held
    lent: int
    """Held GPUs the job uses."""


def _cap(job: PendingJob, n: NodeSlot, gpus: int) -> int:
    if n.name in job.exclude_nodes:
        return 0
    k = gpus // job.gpus_per_replica
    c, m = job.cpus_per_replica, job.memory_per_replica
    if c and n.free_cpus is not None:
        k = min(k, n.free_cpus // c)
    if m and n.free_mem is not None:
        k = min(k, n.free_mem // m)
    return k


def _choose(job: PendingJob, h: Held) -> tuple[str, list[tuple[NodeSlot, int]]] | None:
    """Nodes for every replica inside one domain of the hold at the job's level, from free
    plus held GPUs; the domain with the least room that holds the job, fullest nodes first."""
    level = max_level(job)
    by_domain: dict[str, list[tuple[NodeSlot, int]]] = {}
    for n in h.nodes:
        k = _cap(job, n, n.free + h.held.get(n.name, 0))
        if k > 0:
            by_domain.setdefault(domain_name(n, level), []).append((n, k))
    best: tuple[int, str] | None = None
    for d, caps in by_domain.items():
        room = sum(k for _, k in caps)
        if room >= job.replicas and (best is None or (room, d) < best):
            best = (room, d)
    if best is None:
        return None
    out, left = [], job.replicas
    for n, k in sorted(by_domain[best[1]], key=lambda nk: (nk[1], nk[0].name)):
        if left == 0:
            break
        out.append((n, min(k, left)))
        left -= out[-1][1]
    return best[1], out


def try_backfill(
    job: PendingJob, pools: Iterable[PoolIndex], holds: dict[str, list[Held]], now: datetime,
    factor: float = 1.0, margin_s: float = 0.0,
) -> Backfill | None:
    """Place `job` on GPUs held in `pools` without delaying any hold's gang, or None. The
    job's time limit counts `factor` times (>= 1: a margin for limits looser than others'),
    plus `margin_s` seconds: the backends' slack past the declared limit (Slurm rounds it up
    to whole minutes and adds KillWait, Kubernetes adds the gang's start-up timeout) and the
    time from this cycle to the job's start there."""
    limit = job.max_runtime_s * max(1.0, factor) + max(0.0, margin_s)
    end = now.astimezone(UTC) + _seconds(math.ceil(limit))
    g = job.gpus_per_replica
    for pool in pools:
        for h in holds.get(pool.name, ()):
            if not lends(h):
                continue
            chosen = _choose(job, h)
            if chosen is None:
                continue
            domain, nodes = chosen
            lend: dict[str, int] = {}
            for n, k in nodes:
                extra = max(0, k * g - n.free)
                if extra:
                    lend[n.name] = extra
            if not lend or h.ready_if(lend, end) > h.ready:
                continue
            for n, k in nodes:
                pool.take(n, min(n.free, k * g))
                _charge(job, n, k)
            h.lend(lend, end)
            return Backfill(_placement(job, pool, domain, nodes), h, sum(lend.values()))
    return None


def _seconds(s: int) -> timedelta:
    return timedelta(seconds=max(0, s))


def _charge(job: PendingJob, n: NodeSlot, k: int) -> None:
    if job.cpus_per_replica and n.free_cpus is not None:
        n.free_cpus -= k * job.cpus_per_replica
    if job.memory_per_replica and n.free_mem is not None:
        n.free_mem -= k * job.memory_per_replica


def _placement(
    job: PendingJob, pool: PoolIndex, domain: str, nodes: list[tuple[NodeSlot, int]]
) -> Placement:
    level = max_level(job)
    return Placement(
        backend=pool.snap.backend_kind,
        backend_instance=pool.snap.backend,
        pool=pool.name,
        flavor=pool.flavor,
        topology_level=LEVELS[level],
        topology_domain=domain or None,
        nodes=tuple(n.name for n, k in nodes for _ in range(k)),
    )
