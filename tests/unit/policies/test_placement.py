"""Gang placement: one table row per reason and per preference, plus a topology property."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.domain import Reason
from broker.domain.inventory import InventorySnapshot
from broker.domain.topology import TopologyLevel
from policies.capacity import CapacityIndex
from policies.placement import PlacementResult, commit, place
from policies.types import PendingJob
from tests.unit.policies.builders import T0, PoolBuilder, inventory, make_job, make_pool


@dataclass
class Case:
    id: str
    pools: list[PoolBuilder]
    job: PendingJob
    pool: str | None
    reason: Reason
    unreachable: tuple[str, ...] = ()
    blocked: dict[str, tuple[Reason, str]] = field(default_factory=dict)
    nodes: tuple[str, ...] | None = None
    level: TopologyLevel | None = None
    in_message: str = ""


CASES = [
    Case(
        "best-fit-fills-partly-used-node",
        [make_pool("p1").use("n5", 6)],
        make_job().gpus(2).build(),
        "p1",
        Reason.Admitted,
        nodes=("p1-n5", "p1-n5")[:1],
        level=TopologyLevel.NODE,
    ),
    Case(
        "rack-gang-takes-the-whole-free-rack",
        [make_pool("p1").use("n0", 1)],
        make_job().gpus(8).replicas(4).topology("rack").build(),
        "p1",
        Reason.Admitted,
        nodes=("p1-n4", "p1-n5", "p1-n6", "p1-n7"),
        level=TopologyLevel.RACK,
    ),
    Case(
        "no-flavor-offered",
        [make_pool("p1")],
        make_job().flavors("a100").build(),
        None,
        Reason.NoFlavorFits,
        in_message="a100",
    ),
    Case(
        "backend-unreachable",
        [make_pool("p1")],
        make_job().build(),
        None,
        Reason.BackendUnavailable,
        unreachable=("slurm-a",),
    ),
    Case(
        "pool-drained",
        [make_pool("p1").set(drained=True)],
        make_job().build(),
        None,
        Reason.PoolDrained,
    ),
    Case(
        "image-job-never-offered-a-pool-that-runs-no-images",
        [make_pool("p1").set(runs_images=False)],
        make_job().image("registry.local/train:1").build(),
        None,
        Reason.ImageUnsupported,
        in_message="pool p1 cannot run images",
    ),
    Case(
        "image-job-goes-to-the-pool-that-runs-images",
        [make_pool("p1").set(runs_images=False), make_pool("p2").set(cost_weight=5.0)],
        make_job().image("registry.local/train:1").build(),
        "p2",
        Reason.Admitted,
    ),
    Case(
        "job-without-image-runs-bare-on-a-pool-without-runtime",
        [make_pool("p1").set(runs_images=False)],
        make_job().build(),
        "p1",
        Reason.Admitted,
    ),
    Case(
        "pool-excluded-after-failure",
        [make_pool("p1")],
        make_job().exclude_pools("p1").build(),
        None,
        Reason.PoolExcluded,
    ),
    Case(
        "insufficient-capacity",
        [make_pool("p1").use_all_but({"p1-n0": 4})],
        make_job().gpus(8).build(),
        None,
        Reason.InsufficientCapacity,
        in_message="needs 8 GPUs; 4 of 64 free",
    ),
    Case(
        "topology-unsatisfiable-now",
        [make_pool("p1").use_all_but({"p1-n0": 8, "p1-n4": 8})],
        make_job().gpus(8).replicas(2).topology("rack").build(),
        None,
        Reason.TopologyUnsatisfiable,
        in_message="16 GPUs free",
    ),
    Case(
        "topology-unsatisfiable-ever",
        [make_pool("p1")],
        make_job().gpus(8).replicas(5).topology("rack").build(),
        None,
        Reason.TopologyUnsatisfiable,
        in_message="even when empty",
    ),
    Case(
        "replica-larger-than-any-node",
        [make_pool("p1")],
        make_job().gpus(16).build(),
        None,
        Reason.TopologyUnsatisfiable,
        in_message="largest node",
    ),
    Case(
        "no-requirement-spans-racks",
        [make_pool("p1").use_all_but({"p1-n0": 8, "p1-n4": 8})],
        make_job().gpus(8).replicas(2).build(),
        "p1",
        Reason.Admitted,
        nodes=("p1-n0", "p1-n4"),
        level=TopologyLevel.BLOCK,
    ),
    Case(
        "flavor-preference-wins",
        [make_pool("h").flavor_("h100"), make_pool("a").flavor_("a100")],
        make_job().flavors("a100", "h100").build(),
        "a",
        Reason.Admitted,
    ),
    Case(
        "backend-constraint",
        [make_pool("s"), make_pool("k").on("k8s-a", "k8s")],
        make_job().backend("k8s").build(),
        "k",
        Reason.Admitted,
    ),
    Case(
        "quota-blocked-flavor-falls-back",
        [make_pool("h").flavor_("h100"), make_pool("a").flavor_("a100")],
        make_job().flavors("h100", "a100").build(),
        "a",
        Reason.Admitted,
        blocked={"h100": (Reason.QuotaExhausted, "vision uses 64 of 64")},
    ),
    Case(
        "quota-blocked-only-flavor",
        [make_pool("h")],
        make_job().build(),
        None,
        Reason.QuotaExhausted,
        blocked={"h100": (Reason.QuotaExhausted, "vision uses 64 of 64")},
        in_message="64 of 64",
    ),
    Case(
        "most-severe-across-pools",
        [make_pool("a").use_all_but({}), make_pool("b").on("slurm-b")],
        make_job().build(),
        None,
        Reason.BackendUnavailable,
        unreachable=("slurm-b",),
    ),
    Case(
        "queues-in-shared-busy-pool",
        [make_pool("p1").use_all_but({}).set(max_isthmus_pending=2)],
        make_job().gpus(8).build(),
        "p1",
        Reason.BackendPending,
    ),
    Case(
        "backend-queue-full",
        [make_pool("p1").use_all_but({}).set(max_isthmus_pending=2).pending(isthmus_jobs=2)],
        make_job().gpus(8).build(),
        None,
        Reason.InsufficientCapacity,
        in_message="queue full",
    ),
    Case(
        "exclusive-pool-never-queues",
        [make_pool("p1").use_all_but({}).set(max_isthmus_pending=2, shared=False)],
        make_job().gpus(8).build(),
        None,
        Reason.InsufficientCapacity,
    ),
    Case(
        "lowest-expected-wait-among-busy-pools",
        [
            make_pool("slow").use_all_but({}).set(max_isthmus_pending=4).pending(wait=7200),
            make_pool("fast").use_all_but({}).set(max_isthmus_pending=4).pending(wait=600),
        ],
        make_job().gpus(8).build(),
        "fast",
        Reason.BackendPending,
    ),
    Case(
        "fits-now-beats-queueing",
        [
            make_pool("busy").use_all_but({}).set(max_isthmus_pending=4),
            make_pool("free").set(cost_weight=3.0),
        ],
        make_job().gpus(8).build(),
        "free",
        Reason.Admitted,
    ),
    Case(
        "excluded-node-avoided",
        [make_pool("p1").use_all_but({"p1-n0": 8, "p1-n1": 8})],
        make_job().gpus(8).exclude_nodes("p1-n0").build(),
        "p1",
        Reason.Admitted,
        nodes=("p1-n1",),
    ),
    Case(
        "cpu-request-limits-replicas-per-node",
        [make_pool("p1").shape(1, 1, 2).with_cpus(16)],
        make_job().gpus(1).replicas(2).cpus(12).topology("rack").build(),
        "p1",
        Reason.Admitted,
        nodes=("p1-n0", "p1-n1"),
    ),
    Case(
        "more-cpus-than-any-node-says-so",
        [make_pool("p1").shape(1, 1, 2).with_cpus(16)],
        make_job().gpus(1).cpus(1024).build(),
        None,
        Reason.TopologyUnsatisfiable,
        in_message="a replica needs 1024 CPUs; the largest node of p1 has 16",
    ),
    Case(
        "more-memory-than-any-node-says-so",
        [make_pool("p1").shape(1, 1, 2).with_memory(512)],
        make_job().gpus(1).memory(16384).build(),
        None,
        Reason.TopologyUnsatisfiable,
        in_message="16384.0 GiB of memory; the largest node of p1 has 512.0 GiB",
    ),
    Case(
        "preferred-rack-beats-block",
        [
            make_pool("a").use_all_but({"a-n0": 8, "a-n4": 8}),
            make_pool("b").use_all_but({"b-n0": 8, "b-n1": 8}),
        ],
        make_job().gpus(8).replicas(2).topology("block", "rack").build(),
        "b",
        Reason.Admitted,
        level=TopologyLevel.RACK,
    ),
]


def _run(case: Case) -> PlacementResult:
    index = CapacityIndex(inventory(*case.pools, unreachable=case.unreachable))
    return place(case.job, index, blocked=case.blocked)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_placement(case: Case) -> None:
    result = _run(case)
    assert result.reason is case.reason, result.message
    chosen = result.placement.pool if result.placement else None
    assert chosen == case.pool, result.verdicts
    if case.nodes is not None:
        assert result.placement is not None
        assert result.placement.nodes == case.nodes
    if case.level is not None:
        assert result.placement is not None
        assert result.placement.topology_level == case.level
    assert case.in_message in result.message
    # every candidate pool keeps a verdict, fitting ones first
    assert [v.fits for v in result.verdicts] == sorted(
        (v.fits for v in result.verdicts), reverse=True
    )


def test_placement_is_deterministic() -> None:
    for case in CASES:
        assert _run(case) == _run(case)


def test_commit_consumes_capacity_and_counts_backend_queue() -> None:
    index = CapacityIndex(inventory(make_pool("p1").shape(1, 1, 1).set(max_isthmus_pending=1)))
    job = make_job().gpus(8).build()
    first = place(job, index)
    commit(job, first, index)
    second = place(job, index)
    assert second.reason is Reason.BackendPending and second.queued
    commit(job, second, index)
    third = place(job, index)
    assert third.reason is Reason.InsufficientCapacity
    assert "queue full (1 of 1" in third.message


# ---- property: gangs never cross a forbidden boundary and nodes are never over-committed ----

LEVELS = [None, "node", "rack", "block"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[InventorySnapshot, list[PendingJob]]:
    gpus = draw(st.sampled_from([4, 8]))
    b = make_pool("p").shape(
        blocks=draw(st.integers(1, 2)),
        racks=draw(st.integers(1, 3)),
        nodes=draw(st.integers(1, 4)),
        gpus=gpus,
    )
    for name in b.node_names():
        b.use(name, draw(st.integers(0, gpus)))
    jobs = [
        make_job()
        .gpus(draw(st.integers(1, gpus)))
        .replicas(draw(st.integers(1, 6)))
        .topology(draw(st.sampled_from(LEVELS)))
        .exclude_nodes(*draw(st.lists(st.sampled_from(b.node_names()), max_size=2)))
        .build()
        for _ in range(draw(st.integers(1, 12)))
    ]
    return inventory(b), jobs


def _domain(snap_node: object, level: str) -> str:
    t = snap_node.topology  # type: ignore[attr-defined]
    return t.domain(level, snap_node.name)  # type: ignore[attr-defined]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_gang_stays_in_required_domain_and_never_overcommits(
    scenario: tuple[InventorySnapshot, list[PendingJob]],
) -> None:
    inv, jobs = scenario
    nodes = {n.name: n for n in inv.pools[0].nodes}
    free = {n.name: n.free_gpus for n in nodes.values()}
    index = CapacityIndex(inv)
    for job in jobs:
        result = place(job, index)
        if result.placement is None or result.fit is None:
            # all-or-nothing and complete: no domain at the required level could hold it
            level = job.topology_required.value if job.topology_required else None
            groups: dict[str, int] = Counter()
            for n in nodes.values():
                if n.name in job.exclude_nodes:
                    continue
                key = _domain(n, level) if level else "pool"
                groups[key] += free[n.name] // job.gpus_per_replica
            assert all(c < job.replicas for c in groups.values()), (job, groups)
            continue
        placed = result.placement.nodes
        assert len(placed) == job.replicas
        assert not set(placed) & job.exclude_nodes
        if job.topology_required is not None:
            doms = {_domain(nodes[n], job.topology_required.value) for n in placed}
            assert len(doms) == 1, (job.topology_required, placed)
        commit(job, result, index)
        for name, k in Counter(placed).items():
            free[name] -= k * job.gpus_per_replica
            assert free[name] >= 0, f"over-committed {name}"
            assert index.pools["p"].nodes[name].free == free[name]
    assert index.pools["p"].free == sum(free.values())
    assert T0 is not None


def test_large_gangs_never_wait_in_a_backend_queue() -> None:
    index = CapacityIndex(inventory(make_pool("p1").use_all_but({}).set(max_isthmus_pending=4)))
    result = place(make_job().gpus(8).replicas(2).build(), index)
    assert result.reason is Reason.InsufficientCapacity and result.placement is None


def test_of_two_fitting_pools_the_one_with_a_foreign_backlog_loses() -> None:
    """Jobs that are not Isthmus's, waiting in the backend's own queue, count in the score of a
    pool the gang fits in: the backend may hand the free GPUs to them first. The busy pool
    comes first by name, so without the backlog in the score it would win the tie."""
    busy = make_pool("a-busy").pending(foreign_gpus=64)
    idle = make_pool("b-idle")
    result = place(make_job().gpus(8).build(), CapacityIndex(inventory(busy, idle)))
    assert result.placement is not None and result.placement.pool == "b-idle"
    scores = {v.pool: v.score for v in result.verdicts}
    assert scores["a-busy"] is not None and scores["b-idle"] is not None
    assert scores["a-busy"] > scores["b-idle"]
    plain = place(make_job().gpus(8).build(),
                  CapacityIndex(inventory(make_pool("a-busy"), make_pool("b-idle"))))
    assert plain.placement is not None and plain.placement.pool == "a-busy"


def test_one_per_node_puts_each_replica_on_a_node_of_its_own() -> None:
    """sbatch -N 2 with 4 GPUs a node: two nodes, never both replicas on one 8-GPU node (they
    were: a 2 x 4 gang packed on one node ran on one host); where only one node has room,
    the gang waits, and a pool with fewer nodes than replicas is refused."""
    packed = make_job().gpus(4).replicas(2).topology(None).build()
    spread = make_job().gpus(4).replicas(2).topology(None).one_per_node().build()
    pool = make_pool("p1").shape(racks=1, nodes=2)
    placed = place(packed, CapacityIndex(inventory(pool)))
    assert placed.placement is not None and len(set(placed.placement.nodes)) == 1
    placed = place(spread, CapacityIndex(inventory(pool)))
    assert placed.reason is Reason.Admitted, placed.message
    assert placed.placement is not None and len(set(placed.placement.nodes)) == 2
    busy = make_pool("p1").shape(racks=1, nodes=2).use("n1", 8)
    waiting = place(spread, CapacityIndex(inventory(busy)))
    assert waiting.placement is None or waiting.placement.nodes == ()
    small = make_pool("p1").shape(racks=1, nodes=1)
    refused = place(spread, CapacityIndex(inventory(small)))
    assert refused.reason is Reason.TopologyUnsatisfiable, refused.message
    assert "2 replicas on a node each; p1 has 1 nodes" in refused.message
