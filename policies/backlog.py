"""Free GPUs held for Isthmus jobs already waiting in a backend's queue (admission phase 2).

A job Isthmus queued in a backend pool (a small job that did not fit when admitted) starts
there as soon as the backend finds room for its gang. A new admission must not jump ahead of it
on GPUs it could start on, so those are taken out of the cycle's working copy first. GPUs it
cannot start on (fragments too small for its gang, or outside any one domain of its required
topology level) are not held: the backend would leave them idle for it anyway, and holding them
only keeps the jobs of this cycle off them.

With `by_shape` (PlacementParams.hold_queued_by_shape, off by default: measured in
docs/benchmarks.md) and when the backend reports the queued gangs' shapes
(`QueueDepth.isthmus_pending_shapes`), each
shape, in queue order, holds the GPUs of the place it fits now (best fit, the way admission
places a gang), or nothing when it fits nowhere now. GPUs of queued jobs whose shapes are not
used (the option off, a backend that does not report them, or more jobs than the snapshot
lists) are held the old way: free GPUs on partly used nodes in the fullest racks, up to their count.
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
