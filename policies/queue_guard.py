"""Keeping work Isthmus queues in a backend off the capacity held for a starving gang.

A backend does not know Isthmus's reservations: a job queued there starts wherever room
appears, held GPUs included, so a stream of small queued jobs can starve a gang for good
(tests/unit/sim/test_gang_under_stream.py). Two guards, per pool, set when a gang's
reservation holds capacity there (policies/cycle.py) and the gang has waited
`OrderingParams.queue_closed_after_s` (24 h by default):

- exclusion, in pools whose backend honours a placement's `exclude_nodes` for queued work
  (`PoolSnapshot.excludes_nodes`) while `OrderingParams.queue_exclude` is on: a job queued in
  that backend this cycle carries the nodes of every such domain held in the pool as excluded
  (Slurm `--exclude`, a Kubernetes node affinity `NotIn`), and a job that could not run on
  the other nodes even when they are empty is not queued there. The queue stays open. The
  exclusion is the attempt's: it stays after the gang has started. From then on the gang's
  hold stays in one pool and one domain, chosen by its id among those that could hold it
  (`hold_target`, `rank`): chosen afresh each cycle (where it would fit soonest), the hold
  moved between racks and jobs queued while it held one rack started in the other. Domains
  another gang already holds this cycle come last, so two starving gangs do not pin the same
  rack. A placement excludes at most MAX_EXCLUDED_NODES nodes: when the held nodes (with the
  job's own failed nodes in the pool) are more, the job is not queued in that pool;
- closing, in every other pool: no new job is queued in the pool that cycle.

Not from the first hold: measured, early exclusions pile up on queued jobs that then wait for
the racks left (docs/benchmarks/history/2026-11-29..12-05.md, 2026-12-01 session 6).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection

from broker.domain.attempts import MAX_EXCLUDED_NODES
from broker.domain.topology import BLOCK, LEVEL_NAMES, NODE, POOL, RACK, rank_of
from policies.backlog import give_back
from policies.capacity import PoolIndex
from policies.ordering import OrderingParams
from policies.reservation import HoldTarget, fit_time
from policies.slots import NodeSlot
from policies.types import PendingJob


def guard(pool: PoolIndex, gang: str, domain: str, nodes: Collection[NodeSlot],
          waited_s: float, params: OrderingParams) -> None:
    """Called when `gang` holds capacity in `domain` (`nodes`) of `pool` this cycle."""
    pool.exclusion.taken.update(n.name for n in nodes)
    if waited_s < params.queue_closed_after_s:
        return
    if excluding(pool, waited_s, params):
        ex = pool.exclusion
        ex.holds[gang] = domain or "the pool"
        ex.nodes.update(n.name for n in nodes)
    else:
        pool.queue_closed_for = pool.queue_closed_for or gang


def excluding(pool: PoolIndex, waited_s: float, params: OrderingParams) -> bool:
    """Whether a hold of a gang that has waited `waited_s` is guarded by exclusion here."""
    return (params.queue_exclude and pool.snap.excludes_nodes
            and waited_s >= params.queue_closed_after_s)


def _spot(gang: str, where: str) -> float:
    """A stable pseudo-random number in [0, 1) for the pair (gang, pool or domain)."""
    return int.from_bytes(hashlib.sha256(f"{gang}/{where}".encode()).digest()[:6]) / 2**48


def hold_target(pool: PoolIndex, job: PendingJob, level: int, waited_s: float,
                params: OrderingParams) -> HoldTarget | None:
    """Where the gang `job` holds capacity in `pool`: `PoolIndex.hold_target`, except once its hold
    is guarded by exclusion there, then always the same domain (by its id, among those that
    could hold it when empty, those no other gang holds this cycle first): jobs queued while
    it held one domain must not find it in another, where they may start, the next cycle."""
    g, replicas = job.gpus_per_replica, job.replicas
    if not excluding(pool, waited_s, params):
        return pool.hold_target(g, replicas, level)
    lv = next((lv for lv in range(level + 1) if pool.static_cap(g, lv) >= replicas), -1)
    domains = [(d, ns) for d, ns in pool.domains(lv, replicas * g)
               if sum(n.total // g for n in ns) >= replicas] if lv >= 0 else []
    if not domains:
        return None
    taken = pool.exclusion.taken

    def key(d: tuple[str, list[NodeSlot]]) -> tuple[bool, float]:
        return (any(n.name in taken for n in d[1]), _spot(job.id, d[0]))

    domain, nodes = min(domains, key=key)
    ready = fit_time(nodes, g, replicas, pool.claimed) if pool.has_releases else math.inf
    return HoldTarget(domain, nodes, ready)


def free_held_domain(pools: list[PoolIndex], job: PendingJob, waited_s: float,
                     params: OrderingParams) -> None:
    """Before a starving gang is placed: where its hold is guarded by exclusion (in the pool
    `rank` puts first among its flavor's), the GPUs held in its domain for jobs queued in the
    backend (policies/backlog.py) are freed: jobs queued while it held that domain exclude it."""
    flavors = {f: i for i, f in enumerate(job.flavors)}
    pool = min(pools, default=None, key=lambda p: (
        flavors.get(p.flavor, 99), not excluding(p, waited_s, params), _spot(job.id, p.name)))
    if pool is None or not pool.backlog_nodes or not excluding(pool, waited_s, params):
        return
    t = hold_target(pool, job, rank_of(job.topology_required), waited_s, params)
    if t is not None:
        give_back(pool, t.nodes)


def rank(pool: PoolIndex, gang: str, waited_s: float, params: OrderingParams,
         ready: float) -> float:
    """The key choosing among pools for a hold: when the gang fits (`ready`), except where
    its hold is guarded by exclusion: a stable number, so that it stays in one pool."""
    return _spot(gang, pool.name) - 1.0 if excluding(pool, waited_s, params) else ready


def refusal(pool: PoolIndex, job: PendingJob, level: int) -> str | None:
    """Why `job` may not wait in `pool`'s backend queue because of a hold, or None."""
    if pool.queue_closed_for is not None:
        return f"backend queue closed while capacity is held here for starving gang " \
               f"{pool.queue_closed_for}"
    ex = pool.exclusion
    if ex.nodes and cap_outside(pool, job.gpus_per_replica, level) < job.replicas:
        where = f"one {LEVEL_NAMES[level]}" if level < POOL else "the pool"
        return (f"backend queue: no {job.replicas} x {job.gpus_per_replica} GPUs fit within "
                f"{where} outside the {len(ex.nodes)} node(s) {_held_for(pool)}, even when "
                "empty")
    n = len(ex.nodes | _own(pool, job))
    if n > MAX_EXCLUDED_NODES:
        held = f" ({len(ex.nodes)} node(s) {_held_for(pool)})" if ex.nodes else ""
        return (f"backend queue closed: it would have to exclude {n} node(s){held}, more than "
                f"the {MAX_EXCLUDED_NODES} one placement may")
    return None


def _own(pool: PoolIndex, job: PendingJob) -> set[str]:
    """The job's own excluded nodes (failed there: policies/retry.py) in a pool that honours
    exclusions for queued work."""
    if not pool.snap.excludes_nodes or not job.exclude_nodes:
        return set()
    return {n for n in job.exclude_nodes if n in pool.nodes}


def _held_for(pool: PoolIndex) -> str:
    """"of b0/r00 held for starving gang g1" or, for several, how many and which."""
    holds = pool.exclusion.holds
    if len(holds) == 1:
        (gang, domain), = holds.items()
        return f"of {domain} held for starving gang {gang}"
    first = sorted(holds)[:3]
    more = f" and {len(holds) - 3} more" if len(holds) > 3 else ""
    domains = sorted(set(holds.values()))
    return (f"of {len(domains)} domain(s) held for {len(holds)} starving gangs "
            f"({', '.join(first)}{more})")


def note(pool: PoolIndex, job: PendingJob) -> str:
    """What a queued job's message adds when its placement excludes nodes."""
    ex = pool.exclusion
    held = f", kept off the {len(ex.nodes)} node(s) {_held_for(pool)}" if ex.nodes else ""
    own = _own(pool, job) - ex.nodes
    return f"{held}, kept off {len(own)} node(s) it failed on" if own else held


def excluded(pool: PoolIndex, job: PendingJob) -> tuple[str, ...]:
    """The nodes a placement of `job` queued in `pool`'s backend excludes (at most
    MAX_EXCLUDED_NODES: `refusal` refuses the pool beyond)."""
    return tuple(sorted(pool.exclusion.nodes | _own(pool, job)))


def cap_outside(pool: PoolIndex, g: int, level: int) -> int:
    """Replicas of `g` GPUs the largest domain at `level` holds, empty, without the excluded
    nodes (cached per cycle: the excluded set only grows, so its size keys it)."""
    ex = pool.exclusion
    key = (g, level, len(ex.nodes))
    c = ex.caps.get(key)
    if c is not None:
        return c
    per_rack: list[tuple[str, int]] = []  # (block, replicas)
    best_node = 0
    for r in pool.racks:
        caps = [n.total // g for n in r.nodes if n.name not in ex.nodes]
        per_rack.append((r.block, sum(caps)))
        best_node = max(best_node, *caps, 0)
    if level == NODE:
        c = best_node
    elif level == RACK:
        c = max((v for _, v in per_rack), default=0)
    elif level == BLOCK:
        blocks: dict[str, int] = {}
        for b, v in per_rack:
            blocks[b] = blocks.get(b, 0) + v
        c = max(blocks.values(), default=0)
    else:
        c = sum(v for _, v in per_rack)
    ex.caps[key] = c
    return c
