"""Reservations for starving gangs: the domain where the gang fits soonest by the nodes'
expected releases (declared time limits), else, without release data, the most free GPUs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from broker.domain.inventory import InventorySnapshot
from policies.capacity import RACK, PoolIndex
from policies.cycle import AdmissionParams, admission_cycle, inputs_digest
from policies.ordering import OrderingParams
from policies.reservation import fit_time
from policies.types import PendingJob, Usage
from tests.unit.policies.builders import (
    T0,
    PoolBuilder,
    at,
    inventory,
    make_job,
    make_pool,
    q,
    quota_config,
    usage,
)

QUOTAS = quota_config({"vision": (None, {"h100": q(512)})})
PARAMS = AdmissionParams(ordering=OrderingParams(starvation_after_s=3600))


def gang(replicas: int = 4, gpus: int = 8, submitted: float = -120) -> PendingJob:
    return make_job().gpus(gpus).replicas(replicas).topology("rack").submitted(submitted).build()


def reserved(jobs: list[PendingJob], inv: InventorySnapshot) -> dict[str, str | None]:
    """job id -> 'pool:domain' it holds capacity in (None: no reservation)."""
    res = admission_cycle(jobs, inv, QUOTAS, usage(), T0, PARAMS)
    out: dict[str, str | None] = {}
    for d in res.decisions:
        out[d.job_id] = d.reservation.split(" ")[0] if d.reservation else None
    return out


def pool_r00_more_free_r01_drains_first() -> PoolBuilder:
    # r00 (n0-n3): 24 GPUs free now, its last node is back in 10 h
    # r01 (n4-n7): 8 GPUs free now, all back within 90 min
    return (
        make_pool("p1")
        .release("n3", (600, 8))
        .release("n5", (30, 8))
        .release("n6", (60, 8))
        .release("n7", (90, 8))
    )


def strip_releases(pool: PoolBuilder) -> PoolBuilder:
    pool.releases = {}
    return pool


@dataclass(frozen=True)
class Case:
    id: str
    pool: PoolBuilder
    job: PendingJob
    want: str | None


CASES = [
    Case(
        "drains-first-beats-most-free-now",
        pool_r00_more_free_r01_drains_first(),
        gang(4, 8),
        "p1:b0/r01",
    ),
    Case(
        "no-release-data-keeps-most-free",
        strip_releases(pool_r00_more_free_r01_drains_first()),
        gang(4, 8),
        "p1:b0/r00",
    ),
    Case(
        # r01 gets 16 GPUs back within 10 min, but as 4 + 4 on each node: no node can hold
        # an 8-GPU replica, so it never fits; r00's two whole nodes at 5 h count
        "half-node-releases-do-not-hold-a-replica",
        make_pool("p1")
        .use_all_but({})
        .release("n0", (300, 8))
        .release("n1", (300, 8))
        .release("n4", (10, 4))
        .release("n5", (10, 4))
        .release("n6", (10, 4))
        .release("n7", (10, 4)),
        gang(2, 8),
        "p1:b0/r00",
    ),
    Case(
        # r00 drains first but has two nodes down: it cannot hold 4 x 8 even when empty
        "domain-too-small-when-empty-is-skipped",
        make_pool("p1").down_("n0", "n1").release("n2", (5, 8)).release("n4", (600, 8)),
        gang(4, 8),
        "p1:b0/r01",
    ),
    Case(
        # same drain time: most free now wins, as without release data
        "tie-on-drain-time-goes-to-most-free",
        make_pool("p1").release("n0", (60, 8)).release("n4", (60, 8)).use("n5", 8),
        gang(4, 8),
        "p1:b0/r00",
    ),
    Case(
        # busy GPUs with no known end count as never released: r00 never drains
        "unknown-end-counts-as-never",
        make_pool("p1").use("n0", 8).use("n1", 8).release("n4", (900, 8)).release("n5", (900, 8)),
        gang(4, 8),
        "p1:b0/r01",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reservation_domain(case: Case) -> None:
    got = reserved([case.job], inventory(case.pool))
    assert got[case.job.id] == case.want


def test_a_second_gang_does_not_wait_for_the_same_releases() -> None:
    pool = make_pool("p1").use_all_but({}).release("n0", (30, 8)).release("n4", (300, 8))
    for n in ("n1", "n2", "n3"):
        pool.release(n, (30, 8))
    for n in ("n5", "n6", "n7"):
        pool.release(n, (300, 8))
    first, second = gang(4, 8, submitted=-300), gang(4, 8, submitted=-200)
    got = reserved([first, second], inventory(pool))
    assert got == {first.id: "p1:b0/r00", second.id: "p1:b0/r01"}


def test_within_a_flavor_the_pool_that_drains_first_is_chosen() -> None:
    roomy = make_pool("p1").use("n0", 8).use("n4", 8)  # 48 free, no known ends
    draining = make_pool("p2").on("k8s-a", "k8s").use_all_but({}).release("n0", (60, 8))
    for n in ("n1", "n2", "n3"):
        draining.release(n, (45, 8))
    job = gang(4, 8)
    got = reserved([job], inventory(roomy, draining))
    assert got[job.id] == "p2:b0/r00"
    without = reserved([job], inventory(roomy, strip_releases(draining)))
    assert without[job.id] == "p1:b0/r01"


def test_the_choice_is_deterministic_whatever_the_node_order() -> None:
    pool = pool_r00_more_free_r01_drains_first().build()
    shuffled = pool.model_copy(update={"nodes": tuple(reversed(pool.nodes))})
    job = gang(4, 8)
    runs = [reserved([job], inventory(p)) for p in (pool, pool, shuffled)]
    assert runs[0] == runs[1] == runs[2] == {job.id: "p1:b0/r01"}


@pytest.mark.parametrize(
    ("free", "releases", "g", "replicas", "want"),
    [
        pytest.param({"n0": 8}, {}, 8, 1, -math.inf, id="fits-now"),
        pytest.param({}, {}, 8, 1, math.inf, id="no-releases-never"),
        pytest.param({"n0": 4}, {"n0": ((20, 4),)}, 8, 1, 20, id="free-plus-release-on-one-node"),
        pytest.param({"n0": 4, "n1": 4}, {}, 8, 1, math.inf, id="free-split-over-nodes"),
        pytest.param({}, {"n0": ((5, 4), (40, 4))}, 8, 1, 40, id="second-release-completes"),
        pytest.param({}, {"n0": ((5, 8),), "n1": ((50, 8),)}, 8, 2, 50, id="last-node-back"),
        pytest.param({}, {"n0": ((5, 99),)}, 8, 2, math.inf, id="release-capped-at-total"),
    ],
)
def test_fit_time(
    free: dict[str, int],
    releases: dict[str, tuple[tuple[float, int], ...]],
    g: int,
    replicas: int,
    want: float,
) -> None:
    pool = make_pool("p1").shape(1, 1, 2).use_all_but({f"p1-{n}": k for n, k in free.items()})
    for node, ends in releases.items():
        pool.releases[node] = tuple((at(m), k) for m, k in ends)
    nodes = PoolIndex(pool.build()).racks[0].nodes
    got = fit_time(nodes, g, replicas)
    assert got == (want if math.isinf(want) else at(want).timestamp())


def test_hold_target_without_release_data_says_never() -> None:
    target = PoolIndex(make_pool("p1").use("n0", 8).build()).hold_target(8, 4, RACK)
    assert target is not None and target.domain == "b0/r01" and target.ready == math.inf


def test_the_cycle_digest_sees_release_data() -> None:
    plain = inventory(make_pool("p1").use("n0", 8))
    releasing = inventory(make_pool("p1").use("n0", 8).release("n0", (30, 8)))
    assert inputs_digest([], plain, Usage(), at(0)) != inputs_digest([], releasing, Usage(), at(0))
