"""Free GPUs held for Isthmus jobs already waiting in a backend's queue (admission phase 2).

A job Isthmus queued in a backend pool (a small job that did not fit when admitted) starts
there as soon as the backend finds room for its gang. A new admission must not jump ahead of it,
so free GPUs are taken out of the cycle's working copy first.

By default (and for a backend that does not report the queued gangs' shapes, or for jobs beyond
those the snapshot lists) the GPUs held are free GPUs on partly used nodes in the fullest racks,
up to the queued jobs' GPU count, whatever their shapes. With `by_shape`
(PlacementParams.hold_queued_by_shape; off by default, measured in docs/benchmarks.md) each
reported shape (`QueueDepth.isthmus_pending_shapes`), in queue order, holds the GPUs of the
place its gang fits now (best fit, the way admission places a gang), or nothing when it fits
nowhere now: GPUs it cannot start on (fragments too small for its gang, or not within one
domain of its required level) would stay idle for it in the backend anyway.
"""

from __future__ import annotations

from broker.domain.topology import rank_of
from policies.capacity import PoolIndex


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
                pool.allocate(fit, shape.gpus_per_replica)
                pool.held += shape.gpus
                held += shape.gpus
        pool.start_free = pool.free
    if owed > 0:
        held += pool.hold_for_backend_queue(owed)
    pool.backlog_held += held
    return held
