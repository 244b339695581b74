"""The simulated backend: protocol, virtual time, gangs, failures, external load, seeds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from backends.base import BackendUnavailable
from backends.sim import ExternalLoad, SimBackend, SimClock, SimFailures, SimPoolSpec
from broker.domain import FailureCategory, Reason
from broker.domain.facts import Phase
from broker.domain.inventory import QueuedShape
from broker.domain.topology import TopologyLevel
from tests.harness.requests import sim_request

T0 = datetime(2025, 1, 1, tzinfo=UTC)
POOL = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=2, nodes_per_rack=2, gpus_per_node=8)


def make(seed: int = 0, **kw: object) -> SimBackend:
    return SimBackend("sim-a", "slurm", [POOL], SimClock(T0), seed=seed, **kw)  # type: ignore[arg-type]


def test_lifecycle_in_virtual_time() -> None:
    b = make()
    res = b.submit(sim_request(1, nodes=("p1-n0002",)))
    assert not res.adopted and b.submit(sim_request(1)).adopted  # idempotent by name
    fact = b.lookup("isthmus-j1-1")
    assert fact is not None and fact.phase is Phase.STARTING and fact.nodes == ("p1-n0002",)
    b.advance(60)
    assert b.lookup("isthmus-j1-1").phase is Phase.RUNNING  # type: ignore[union-attr]
    free = {n.name: n.free_gpus for n in b.inventory().pools[0].nodes}
    assert free["p1-n0002"] == 0 and sum(free.values()) == 24
    b.advance(600)
    done = b.lookup("isthmus-j1-1")
    assert done is not None and done.phase is Phase.SUCCEEDED and done.reason is Reason.Succeeded
    assert (done.ended_at - done.started_at).total_seconds() == 630  # type: ignore[operator]
    assert b.inventory().pools[0].free_gpus == 32


def test_gang_waits_all_or_nothing_and_queue_depth_shows_it() -> None:
    b = make()
    b.submit(sim_request(1, replicas=3, duration=1000))
    b.submit(sim_request(2, replicas=2, duration=1000, level=TopologyLevel.RACK))
    assert b.lookup("isthmus-j2-1").phase is Phase.PENDING  # type: ignore[union-attr]
    q = b.inventory().pools[0].queue
    assert (q.isthmus_pending_jobs, q.isthmus_pending_gpus) == (1, 16)
    assert q.isthmus_pending_shapes == (
        QueuedShape(replicas=2, gpus_per_replica=8, level=TopologyLevel.RACK),
    )
    b.advance(1100)
    f = b.lookup("isthmus-j2-1")
    assert f is not None and f.phase is Phase.RUNNING
    assert len(f.nodes) == 2
    assert set(f.nodes) <= {"p1-n0000", "p1-n0001"} or set(f.nodes) <= {"p1-n0002", "p1-n0003"}


def test_cancel_frees_the_nodes() -> None:
    b = make()
    b.submit(sim_request(1, replicas=4))
    r = b.cancel("isthmus-j1-1", grace_seconds=30)
    assert r.found and r.signalled
    assert b.lookup("isthmus-j1-1").phase is Phase.CANCELLED  # type: ignore[union-attr]
    assert b.inventory().pools[0].free_gpus == 32
    assert not b.cancel("nope", 0).found


def test_node_failure_fails_its_job_as_infra_transient() -> None:
    b = make()
    b.submit(sim_request(1, nodes=("p1-n0001",)))
    b.fail_node("p1-n0001")
    f = b.lookup("isthmus-j1-1")
    assert f is not None and f.phase is Phase.FAILED
    assert f.failure is FailureCategory.INFRA_TRANSIENT and "p1-n0001" in f.message
    node = next(n for n in b.inventory().pools[0].nodes if n.name == "p1-n0001")
    assert not node.schedulable and node.free_gpus == 0


def test_observe_lists_isthmus_objects_and_reports_lost_ones() -> None:
    b = make(external=ExternalLoad(arrivals_per_hour=60))
    b.submit(sim_request(1))
    b.advance(3600)
    facts = b.observe(["isthmus-j1-1", "isthmus-gone-1"])
    names = [f.backend_name for f in facts]
    assert names == ["isthmus-j1-1", "isthmus-gone-1"]
    assert facts[1].phase is Phase.LOST


def test_unreachable_raises() -> None:
    b = make()
    b.reachable = False
    with pytest.raises(BackendUnavailable):
        b.inventory()


def _run(seed: int) -> list[tuple[str, str, str | None]]:
    b = make(
        seed,
        failures=SimFailures(job_failure_rate=0.5),
        external=ExternalLoad(arrivals_per_hour=30, mean_duration_s=900),
    )
    for i in range(20):
        b.submit(sim_request(i, gpus=1 + i % 8, duration=None))
        b.advance(120)
    b.advance(86400)  # the ended ones have left for the accounting: asked for by name
    names = [f"isthmus-j{i}-1" for i in range(20)]
    return [(f.backend_name, f.phase.value, f.failure and f.failure.value)
            for f in b.observe(names)]


def test_same_seed_same_history() -> None:
    one, two = _run(7), _run(7)
    assert one == two
    assert any(phase == "FAILED" for _, phase, _ in one)
    assert _run(8) != one
