"""The simulated backend reports when busy GPUs are due back the way a real scheduler knows it:
start + declared time limit (max_runtime), never the simulated true run time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from backends.base import SubmitRequest
from backends.sim import ExternalLoad, SimBackend, SimClock, SimPoolSpec
from broker.domain.inventory import NodeSnapshot
from tests.harness.requests import sim_request

T0 = datetime(2025, 1, 1, tzinfo=UTC)
POOL = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=1, nodes_per_rack=2, gpus_per_node=8)


def make(**kw: object) -> SimBackend:
    return SimBackend("sim-a", "slurm", [POOL], SimClock(T0), **kw)  # type: ignore[arg-type]


def request(n: int, node: str, gpus: int, max_runtime: int, duration: float) -> SubmitRequest:
    return sim_request(n, gpus=gpus, nodes=(node,), duration=duration, max_runtime=max_runtime)


def nodes(b: SimBackend) -> dict[str, NodeSnapshot]:
    return {n.name: n for n in b.inventory().pools[0].nodes}


def test_releases_come_from_declared_limits_not_true_durations() -> None:
    b = make()
    b.advance(100)
    b.submit(request(1, "p1-n0000", 4, max_runtime=7200, duration=600))
    b.submit(request(2, "p1-n0000", 2, max_runtime=3600, duration=5000))
    start = T0 + timedelta(seconds=100)
    n0 = nodes(b)["p1-n0000"]
    assert n0.free_gpus == 2
    # soonest first; j2 runs past its limit in truth, j1 ends long before it
    assert n0.releases == ((start + timedelta(hours=1), 2), (start + timedelta(hours=2), 4))
    assert nodes(b)["p1-n0001"].releases == ()
    b.advance(700)  # j1 has ended (600 s + 30 s start delay): its release goes with it
    assert nodes(b)["p1-n0000"].releases == ((start + timedelta(hours=1), 2),)


def test_a_backend_that_cannot_tell_reports_no_releases() -> None:
    b = make(releases=False)
    b.submit(request(1, "p1-n0000", 8, max_runtime=3600, duration=600))
    n0 = nodes(b)["p1-n0000"]
    assert n0.free_gpus == 0 and n0.releases == ()


def test_external_load_releases_only_with_a_declared_limit() -> None:
    for limit, want_releases in ((None, False), (1800.0, True)):
        b = make(seed=4, external=ExternalLoad(arrivals_per_hour=120, gpus=(8,), limit_s=limit))
        b.advance(3600)
        busy = [n for n in nodes(b).values() if n.free_gpus < n.total_gpus]
        assert busy, "external load should occupy a node within the hour"
        assert all(bool(n.releases) is want_releases for n in busy)
        for n in busy:
            assert all(g == 8 for _, g in n.releases)
