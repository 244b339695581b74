"""Free GPUs held for Isthmus jobs already waiting in a backend's queue (admission phase 2).

A job Isthmus queued in a backend pool (a small job that did not fit when admitted) starts
there as soon as the backend finds room for its gang. A new admission must not jump ahead of it,
so free GPUs are taken out of the cycle's working copy first.

By default (and for a backend that does not report the queued gangs' shapes, or for jobs beyond
those the snapshot lists) the GPUs held are free GPUs on partly used nodes in the fullest racks,
up to the queued jobs' GPU count, whatever their shapes. With `by_shape`
(PlacementParams.hold_queued_by_shape; off by default, measured 2026-12-01 session 5 in
docs/benchmarks/history/2026-11-29..12-05.md) each
reported shape (`QueueDepth.isthmus_pending_shapes`), in queue order, holds the GPUs of the
place its gang fits now (best fit, the way admission places a gang), or nothing when it fits
nowhere now: GPUs it cannot start on (fragments too small for its gang, or not within one
domain of its required level) would stay idle for it in the backend anyway.

Jobs queued while a starving gang's hold is guarded by exclusion (policies/queue_guard.py) can
never start on that gang's domain: `give_back` returns what was held there before the gang is
placed, so the gang is not refused for GPUs kept for jobs that cannot use them.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.domain.topology import rank_of
from policies.capacity import PoolIndex
from policies.slots import NodeSlot


def hold_backend_queue(pool: PoolIndex, by_shape: bool = True) -> int:
    """Hold in `pool` the free GPUs its backend-queued Isthmus jobs can start on; returns the
    GPUs held (also counted in `pool.backlog_held`)."""
    q = pool.snap.queue
    owed = q.isthmus_pending_gpus
    if not owed:
        return 0
    shapes = q.isthmus_pending_shapes if by_shape else None
    held = 0
    if shapes is not None:
        for shape in shapes:
            owed -= shape.gpus
            fit = pool.find(shape.gpus_per_replica, shape.replicas, rank_of(shape.level))
            if fit is not None:
                for node, k in fit.nodes:
                    _hold(pool, node, k * shape.gpus_per_replica)
                held += shape.gpus
    if owed > 0:
        held += _hold_anywhere(pool, owed)
    pool.start_free = pool.free
    return held


def _hold(pool: PoolIndex, node: NodeSlot, gpus: int) -> None:
    pool.take(node, gpus)
    pool.held += gpus
    pool.backlog_held += gpus
    pool.backlog_nodes[node.name] = pool.backlog_nodes.get(node.name, 0) + gpus


def _hold_anywhere(pool: PoolIndex, gpus: int) -> int:
    """Hold `gpus` free GPUs where a small queued job would go: partly used nodes in the
    fullest racks first, leaving whole racks to gangs. Returns the GPUs held."""
    held = 0
    for rack in sorted(pool.racks, key=lambda r: (r.free, r.key)):
        for n in sorted(rack.nodes, key=lambda n: (n.free, n.name)):
            if held >= gpus:
                return held
            if n.free:
                take = min(n.free, gpus - held)
                _hold(pool, n, take)
                held += take
    return held


def give_back(pool: PoolIndex, nodes: Iterable[NodeSlot]) -> int:
    """Free again the GPUs held on `nodes` for backend-queued jobs; returns how many."""
    given = 0
    for n in nodes:
        gpus = pool.backlog_nodes.pop(n.name, 0)
        if gpus:
            pool.take(n, -gpus)
            pool.held -= gpus
            pool.backlog_held -= gpus
            given += gpus
    return given
