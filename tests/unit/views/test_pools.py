"""Pool views (pure): capacity, free, ours vs foreign, queues, drain, reachability, domains."""

from __future__ import annotations

from datetime import timedelta

from broker.config import IsthmusConfig
from broker.control.inventories import Answer
from broker.domain.clock import utcnow
from broker.domain.inventory import (
    InventorySnapshot,
    NodeSnapshot,
    PoolSnapshot,
    QueueDepth,
    TopologyPath,
)
from broker.domain.spec import BackendKind
from broker.store.pools import PoolState
from broker.views.pools import pool_views


def _node(name: str, block: str, rack: str, free: int, ok: bool = True) -> NodeSnapshot:
    return NodeSnapshot(name=name, total_gpus=8, free_gpus=free, schedulable=ok,
                        topology=TopologyPath(block=block, rack=rack))


def _answer(taken_ago: float = 3.0) -> Answer:
    now = utcnow()
    pool = PoolSnapshot(
        name="slurm-h100", backend_kind=BackendKind.SLURM, backend="sim-slurm", flavor="h100-80g",
        nodes=(_node("n1", "b1", "r1", 8), _node("n2", "b1", "r1", 2), _node("n3", "b1", "r2", 0),
               _node("n4", "b2", "r3", 6), _node("n5", "b2", "r3", 8, ok=False)),
        queue=QueueDepth(isthmus_pending_gpus=16, foreign_pending_gpus=24),
    )
    return Answer(InventorySnapshot(taken_at=now, pools=(pool,)), "",
                  now - timedelta(seconds=taken_ago))


def test_capacity_free_ours_foreign_queues_and_domains(example_config: IsthmusConfig) -> None:
    views = {v.name: v for v in pool_views(
        example_config, {}, {"sim-slurm": _answer()}, {"slurm-h100": (12, 8)}, utcnow())}
    v = views["slurm-h100"]
    assert (v.capacity_gpus, v.free_gpus, v.unschedulable_gpus) == (40, 16, 8)
    # busy on schedulable nodes: 0 + 6 + 8 + 2 = 16, of which Isthmus holds 12
    assert (v.isthmus_gpus, v.foreign_gpus, v.isthmus_waiting_gpus) == (12, 4, 8)
    assert (v.queued_isthmus_gpus, v.queued_foreign_gpus) == (16, 24)
    assert v.reachable and v.note == "" and 2.0 <= (v.inventory_age_s or 0) < 60
    assert [(r.name, r.free_gpus) for r in v.racks] == [("b1/r1", 10), ("b1/r2", 0),
                                                         ("b2/r3", 6)]
    assert (v.largest_free_rack, v.largest_free_block, v.largest_free_node) == (10, 10, 8)
    # the drained node's free GPUs are in no domain's free count
    assert [(b.name, b.free_gpus, b.total_gpus) for b in v.blocks] == [("b1", 10, 24),
                                                                      ("b2", 6, 16)]


def test_ours_never_counts_beyond_what_the_backend_shows_busy(
        example_config: IsthmusConfig) -> None:
    """Issue 31: after a simulator restart a pool showed 32 free plus 16 held of 32 GPUs: the
    attempts the backend no longer shows were counted on its nodes. They are counted apart."""
    views = {v.name: v for v in pool_views(
        example_config, {}, {"sim-slurm": _answer()}, {"slurm-h100": (30, 2)}, utcnow())}
    v = views["slurm-h100"]
    assert (v.free_gpus, v.isthmus_gpus, v.foreign_gpus, v.isthmus_unseen_gpus,
            v.isthmus_waiting_gpus) == (16, 16, 0, 14, 2)
    assert v.free_gpus + v.isthmus_gpus + v.foreign_gpus + v.unschedulable_gpus \
        == v.capacity_gpus


def test_unreachable_and_never_seen_backends_show_their_configured_shape(
    example_config: IsthmusConfig,
) -> None:
    down = Answer(None, "backend sim-k8s unreachable since 2026-12-01T06:00:00Z: refused")
    views = {v.name: v for v in pool_views(example_config, {}, {"sim-k8s": down}, {}, utcnow())}
    k8s, slurm = views["k8s-h100"], views["slurm-h100"]
    assert not k8s.reachable and "refused" in k8s.note and k8s.free_gpus == 0
    assert k8s.capacity_gpus > 0  # the configured nodes x GPUs per node
    assert not slurm.reachable and "no inventory" in slurm.note


def test_drained_by_whom_and_why(example_config: IsthmusConfig) -> None:
    now = utcnow()
    states = {"slurm-h100": PoolState("slurm-h100", True, "firmware", "ops-alice", now)}
    v = next(p for p in pool_views(example_config, states, {}, {}, now) if p.name == "slurm-h100")
    assert (v.drained, v.drained_by, v.drain_reason, v.drained_at) == (
        True, "ops-alice", "firmware", now)
    undrained = {"slurm-h100": PoolState("slurm-h100", False, "", "ops-bob", now)}
    v = next(p for p in pool_views(example_config, undrained, {}, {}, now)
             if p.name == "slurm-h100")
    assert (v.drained, v.drained_by) == (False, None)


def test_placements_the_nodes_do_not_show_are_not_counted_as_held(
    example_config: IsthmusConfig,
) -> None:
    """A restarted simulator forgets its jobs: its nodes are free while the store still places
    attempts there until reconciliation ends them. The view never counts a GPU twice."""
    now = utcnow()
    pool = PoolSnapshot(
        name="slurm-h100", backend_kind=BackendKind.SLURM, backend="sim-slurm",
        flavor="h100-80g",
        nodes=tuple(_node(f"n{i}", "b1", "r1", 8) for i in range(4)),  # 32 GPUs, all free
    )
    fresh = Answer(InventorySnapshot(taken_at=now, pools=(pool,)), "", now)
    v = next(p for p in pool_views(example_config, {}, {"sim-slurm": fresh},
                                   {"slurm-h100": (16, 0)}, now) if p.name == "slurm-h100")
    assert (v.capacity_gpus, v.free_gpus) == (32, 32)
    assert (v.isthmus_gpus, v.foreign_gpus, v.isthmus_unseen_gpus) == (0, 0, 16)
    assert v.free_gpus + v.isthmus_gpus + v.foreign_gpus + v.unschedulable_gpus == 32
