"""Jobs queued in a backend while a gang that has waited `queue_closed_after_s` holds capacity
there (policies/queue_guard.py): where the backend honours exclusions they carry the held nodes
as excluded and the queue stays open; elsewhere the queue closes (tests/unit/policies/
test_backlog.py has that fallback too)."""

from __future__ import annotations

from policies.cycle import AdmissionParams, Decision, admission_cycle
from policies.ordering import OrderingParams
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
DAY_MIN = 24 * 60


def decide(pool: PoolBuilder, waited_min: float, params: AdmissionParams | None = None
           ) -> dict[str, Decision]:
    """A 2 x 8 rack gang that has waited `waited_min` and a small 8-GPU job that fits on no
    node now, in one cycle."""
    gang = (make_job().id("gang").team("vision").gpus(8).replicas(2).topology("rack")
            .submitted(-waited_min).build())
    small = make_job().id("small").team("vision").gpus(8).submitted(-1).build()
    d = admission_cycle([gang, small], inventory(pool), QUOTAS, usage(), at(0), params)
    out = d.by_job()
    assert out["gang"].reservation is not None, out["gang"].message
    return out


def two_racks(excludes: bool) -> PoolBuilder:
    # racks r00 (n0, n1) and r01 (n2, n3); 4 GPUs free on n0, none elsewhere
    return (make_pool("p1").shape(1, 2, 2).use_all_but({"p1-n0": 4})
            .set(max_isthmus_pending=2, excludes_nodes=excludes))


def test_a_job_queued_while_a_long_starving_gang_holds_a_rack_excludes_its_nodes() -> None:
    small = decide(two_racks(True), DAY_MIN + 1)["small"]
    assert small.admitted and small.placement is not None, small.message
    assert small.placement.nodes == ()  # queued in the backend
    assert small.placement.exclude_nodes == ("p1-n0", "p1-n1")
    assert "kept off the 2 node(s) of b0/r00 held for starving gang gang" in small.message
    # under queue_closed_after_s the hold does not reach the queue
    early = decide(two_racks(True), DAY_MIN - 60)["small"]
    assert early.admitted and early.placement is not None
    assert early.placement.exclude_nodes == () and "kept off" not in early.message


def test_without_the_capability_or_the_option_nothing_is_excluded() -> None:
    for pool, params in (
        (two_racks(False), None),
        (two_racks(True), AdmissionParams(ordering=OrderingParams(queue_exclude=False))),
    ):
        closed = decide(pool, DAY_MIN + 1, params)["small"]  # the fallback: queue closed
        assert not closed.admitted and "backend queue closed" in closed.message


def test_a_job_that_fits_nowhere_outside_the_held_nodes_is_not_queued_there() -> None:
    # one rack of two nodes: the gang holds the whole pool, so a queued job could never start
    pool = (make_pool("p1").shape(1, 1, 2).use_all_but({"p1-n0": 4})
            .set(max_isthmus_pending=2, excludes_nodes=True))
    small = decide(pool, DAY_MIN + 1)["small"]
    assert not small.admitted
    assert ("no 1 x 8 GPUs fit within the pool outside the 2 node(s) of b0/r00 held for "
            "starving gang gang, even when empty") in small.message
