"""Several starving gangs whose holds are guarded by exclusion (policies/queue_guard.py): they
hold different racks, a placement never excludes more than MAX_EXCLUDED_NODES nodes (the pool
is refused to that job instead, the cycle goes on), GPUs held for backend-queued jobs that
exclude a gang's rack go back to the gang, reasons count every gang held for, and a queued job
also excludes the nodes it failed on."""

from __future__ import annotations

from broker.domain.attempts import MAX_EXCLUDED_NODES
from broker.domain.inventory import QueueDepth
from policies.cycle import Decision, admission_cycle
from policies.types import PendingJob
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

QUOTAS = quota_config({"vision": ("research", {"h100": q(100_000)})})
DAY_MIN = 24 * 60


def gangs(*ids: int, replicas: int = 2, waited_min: float = DAY_MIN + 10) -> list[PendingJob]:
    return [make_job().id(f"gang{i}").team("vision").gpus(8).replicas(replicas)
            .topology("rack").submitted(-(waited_min + i)).build() for i in ids]


def small(*exclude: str) -> PendingJob:
    return make_job().id("small").team("vision").gpus(8).submitted(-1).exclude_nodes(
        *exclude).build()


def cycle(pool: PoolBuilder, jobs: list[PendingJob]) -> dict[str, Decision]:
    return admission_cycle(jobs, inventory(pool), QUOTAS, usage(), at(0)).by_job()


def rack_of(d: Decision) -> str:
    assert d.reservation is not None, d.message
    return d.reservation.split(" ")[0].removeprefix("p1:")


def test_more_held_nodes_than_a_placement_may_exclude_refuse_the_pool_not_the_cycle() -> None:
    # 5 racks x 1,400 nodes all in use but 4 GPUs on n0; four starving 2 x 8 rack gangs
    pool = (make_pool("p1").shape(1, 5, 1400).use_all_but({"p1-n0": 4})
            .set(max_isthmus_pending=2, excludes_nodes=True))
    d = cycle(pool, [*gangs(0, 1, 2, 3), small()])
    assert len({rack_of(d[f"gang{i}"]) for i in range(4)}) == 4
    s = d["small"]
    assert not s.admitted and s.placement is None
    assert (f"backend queue closed: it would have to exclude 5600 node(s) (5600 node(s) of 4 "
            f"domain(s) held for 4 starving gangs (gang0, gang1, gang2 and 1 more)), more than the "
            f"{MAX_EXCLUDED_NODES} one placement may") in s.message
    # with two gangs (2,800 nodes) the same job is queued, kept off their racks
    d = cycle(pool, [*gangs(0, 1), small()])
    s = d["small"]
    assert s.admitted and s.placement is not None, s.message
    assert len(s.placement.exclude_nodes) == 2800


def released(pool: PoolBuilder) -> PoolBuilder:
    for n in range(8):  # every node frees its 8 GPUs within the next 1-2 hours
        pool = pool.release(f"p1-n{n}", (60 + n, 8))
    return pool


def test_two_guarded_gangs_never_hold_the_same_rack() -> None:
    pool = released(make_pool("p1").shape(1, 4, 2).use_all_but({})
                    .set(max_isthmus_pending=2, excludes_nodes=True))
    for a in range(8):
        for b in range(a + 1, 8):
            d = cycle(pool, gangs(a, b))
            assert rack_of(d[f"gang{a}"]) != rack_of(d[f"gang{b}"]), (a, b)


def backlogged() -> PoolBuilder:
    # r00 (n0-n3) empty, r01 full; 2 Isthmus jobs of 4 GPUs queued in the backend
    free = {f"p1-n{i}": 8 for i in range(4)}
    pool = (make_pool("p1").shape(1, 2, 4).use_all_but(free)
            .set(max_isthmus_pending=2, excludes_nodes=True))
    pool.queue = QueueDepth(isthmus_pending_jobs=2, isthmus_pending_gpus=8)
    return pool


def test_gpus_held_for_queued_jobs_go_back_to_the_guarded_gang_whose_rack_they_exclude(
) -> None:
    def gang(waited_min: float) -> PendingJob:  # its id puts its guarded hold in r00
        return (make_job().id("gang").team("vision").gpus(8).replicas(4).topology("rack")
                .submitted(-waited_min).build())

    d = cycle(backlogged(), [gang(DAY_MIN + 10)])["gang"]
    assert d.admitted and d.placement is not None, d.message
    assert d.placement.topology_domain == "b0/r00"
    # before its hold is guarded (waited under a day) the queued jobs may use r00: kept
    d = cycle(backlogged(), [gang(DAY_MIN - 60)])["gang"]
    assert not d.admitted
    assert "8 more held for Isthmus jobs queued in the backend" in d.message


def test_a_queued_job_is_told_of_every_gang_and_domain_it_is_kept_off() -> None:
    pool = (make_pool("p1").shape(1, 4, 2).use_all_but({"p1-n0": 4})
            .set(max_isthmus_pending=2, excludes_nodes=True))
    d = cycle(pool, [*gangs(0, 1, 2), small()])
    s = d["small"]
    assert s.admitted and s.placement is not None and len(s.placement.exclude_nodes) == 6
    assert ("kept off the 6 node(s) of 3 domain(s) held for 3 starving gangs "
            "(gang0, gang1, gang2)") in s.message


def test_a_queued_job_also_excludes_the_nodes_it_failed_on_in_that_pool() -> None:
    def pool(excludes: bool) -> PoolBuilder:
        return (make_pool("p1").shape(1, 2, 2).use_all_but({"p1-n0": 4})
                .set(max_isthmus_pending=2, excludes_nodes=excludes))

    own = small("p1-n3", "p9-n1")  # p9-n1 is in another pool
    s = cycle(pool(True), [own])["small"]
    assert s.admitted and s.placement is not None and s.placement.nodes == ()
    assert s.placement.exclude_nodes == ("p1-n3",)
    assert "kept off 1 node(s) it failed on" in s.message
    d = cycle(pool(True), [*gangs(0), own])
    s = d["small"]
    assert s.placement is not None
    held = {"b0/r00": ("p1-n0", "p1-n1"), "b0/r01": ("p1-n2", "p1-n3")}[rack_of(d["gang0"])]
    assert s.placement.exclude_nodes == tuple(sorted({*held, "p1-n3"}))
    s = cycle(pool(False), [own])["small"]  # a backend that cannot exclude is not asked to
    assert s.placement is not None and s.placement.exclude_nodes == ()


def test_a_job_that_failed_on_more_nodes_than_a_placement_may_exclude_is_not_queued() -> None:
    pool = (make_pool("p1").shape(1, 1, MAX_EXCLUDED_NODES + 2).use_all_but({"p1-n0": 4})
            .set(max_isthmus_pending=2, excludes_nodes=True))
    s = cycle(pool, [small(*(f"p1-n{i}" for i in range(MAX_EXCLUDED_NODES + 1)))])["small"]
    assert not s.admitted and s.placement is None
    assert (f"backend queue closed: it would have to exclude {MAX_EXCLUDED_NODES + 1} node(s), "
            f"more than the {MAX_EXCLUDED_NODES} one placement may") in s.message
