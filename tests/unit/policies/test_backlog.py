"""Isthmus jobs queued in a backend: free GPUs are held for them only where a queued gang can
start, when the backend reports the gangs' shapes (policies/backlog.py); and no job is queued
in a pool where a starving gang holds capacity (policies/placement.py)."""

from __future__ import annotations

from broker.domain import Reason
from broker.domain.inventory import QueuedShape
from broker.domain.topology import TopologyLevel
from policies.cycle import AdmissionParams, Decision, admission_cycle
from policies.placement import PlacementParams
from tests.unit.policies.builders import (
    PoolBuilder,
    at,
    inventory,
    make_job,
    make_pool,
    q,
    quota_config,
    usage,
)

QUOTAS = quota_config({"vision": ("research", {"h100": q(64)})})


def queued(pool: PoolBuilder, *shapes: QueuedShape | None) -> PoolBuilder:
    """`pool` with Isthmus jobs pending in its backend: 4 GPUs each when a shape is None
    (shapes then not reported), else the given gangs."""
    gpus = sum(4 if s is None else s.gpus for s in shapes)
    reported = None if None in shapes else tuple(s for s in shapes if s is not None)
    pool.queue = pool.queue.model_copy(update={
        "isthmus_pending_gpus": gpus, "isthmus_pending_jobs": len(shapes),
        "isthmus_pending_shapes": reported})
    return pool.set(max_isthmus_pending=len(shapes))


def two_half_free_nodes() -> PoolBuilder:
    # one rack of 2 nodes, each with 4 of 8 GPUs free: 8 free, no node holds 8
    return make_pool("p1").shape(1, 1, 2).use("p1-n0", 4).use("p1-n1", 4)


BY_SHAPE = AdmissionParams(placement=PlacementParams(hold_queued_by_shape=True))


def decide_one(pool: PoolBuilder, gpus: int = 4,
               params: AdmissionParams = BY_SHAPE) -> Decision:
    job = make_job().team("vision").gpus(gpus).build()
    return admission_cycle([job], inventory(pool), QUOTAS, usage(), at(0), params).decisions[0]


def test_free_gpus_a_queued_gang_cannot_use_are_not_held() -> None:
    # the queued job needs 8 GPUs on one node: the 4 + 4 free cannot start it, so the backend
    # leaves them idle for it; a 4-GPU job starts there now
    pool = queued(two_half_free_nodes(), QueuedShape(replicas=1, gpus_per_replica=8))
    d = decide_one(pool)
    assert d.admitted, d.message
    # the option off (the default): every owed GPU is held, whatever the shape
    assert not decide_one(pool, params=AdmissionParams()).admitted


def test_free_gpus_a_queued_gang_can_start_on_are_held_and_the_reason_says_so() -> None:
    pool = queued(two_half_free_nodes(), QueuedShape(replicas=2, gpus_per_replica=4))
    d = decide_one(pool)
    assert not d.admitted and d.reason is Reason.InsufficientCapacity
    assert "needs 4 GPUs; 0 of 16 free, 8 more held for Isthmus jobs queued" in d.message


def test_a_rack_gang_holds_nothing_when_no_one_rack_holds_it() -> None:
    # 4 GPUs free in each of two racks; the queued 2 x 4 gang must share one rack
    pool = make_pool("p1").shape(1, 2, 1).use("p1-n0", 4).use("p1-n1", 4)
    shape = QueuedShape(replicas=2, gpus_per_replica=4, level=TopologyLevel.RACK)
    assert decide_one(queued(pool, shape)).admitted
    spread = QueuedShape(replicas=2, gpus_per_replica=4)  # any two nodes: it could start
    pool = make_pool("p1").shape(1, 2, 1).use("p1-n0", 4).use("p1-n1", 4)
    assert not decide_one(queued(pool, spread)).admitted


def test_without_shapes_every_owed_gpu_is_held_as_before() -> None:
    # a backend that does not report shapes: two 4-GPU jobs owed, all 8 free GPUs held
    d = decide_one(queued(two_half_free_nodes(), None, None))
    assert not d.admitted and "0 of 16 free, 8 more held" in d.message


def test_no_job_is_queued_in_a_backend_where_a_long_starving_gang_holds_capacity() -> None:
    # the backend would start a queued job on the GPUs held for the gang (it does not know
    # the reservation), so once the gang has waited queue_closed_after_s (24 h) and holds
    # capacity in the pool, its queue takes no job
    pool = make_pool("p1").shape(1, 2, 2).use_all_but({"p1-n0": 4}).set(max_isthmus_pending=2)
    small = make_job().team("vision").gpus(8).submitted(-1).build()  # fits on no node now

    def decide(waited_min: float) -> dict[str, Decision]:
        gang = (make_job().id("gang").team("vision").gpus(8).replicas(2).topology("rack")
                .submitted(-waited_min).build())
        d = admission_cycle([gang, small], inventory(pool), QUOTAS, usage(), at(0)).by_job()
        assert d["gang"].reservation is not None
        return d

    closed = decide(24 * 60 + 1)[small.id]
    assert not closed.admitted, closed.message
    assert "backend queue closed while capacity is held here for starving gang gang" in \
        closed.message
    queued = decide(23 * 60)[small.id]  # starving (a hold) but under the bound: queued
    assert queued.admitted and queued.placement is not None and queued.placement.nodes == ()
