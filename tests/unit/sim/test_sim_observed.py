"""The simulator's observe answer (backends.base.Observed): its phases and reasons are those
of its facts, the facts are built only when read, and each is what the job was when it was
observed, whatever the job became since."""

from __future__ import annotations

from datetime import UTC, datetime

from backends.base import Observed, said_of
from backends.sim import SimBackend, SimClock, SimFailures, SimPoolSpec
from broker.domain import Reason
from broker.domain.facts import Phase
from tests.harness.requests import sim_request

T0 = datetime(2025, 1, 1, tzinfo=UTC)
POOL = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=2, nodes_per_rack=2, gpus_per_node=8)


def _sim() -> SimBackend:
    """Jobs in every phase: ended, running, starting, pending."""
    b = SimBackend("sim-a", "slurm", [POOL], SimClock(T0), seed=3,
                   failures=SimFailures(start_delay_s=30))
    b.submit(sim_request(1, duration=100))
    b.submit(sim_request(2, duration=5000))
    b.advance(200)  # j1 ended, j2 runs
    b.submit(sim_request(3, duration=5000))  # starting (the start delay)
    b.submit(sim_request(4, replicas=4, duration=100))  # pending: no room
    return b


def test_said_is_what_the_facts_say_and_lost_names_are_lost() -> None:
    b = _sim()
    got = b.observe(["isthmus-j1-1", "isthmus-gone-1"])
    assert isinstance(got, Observed)
    facts = list(got)
    assert [f.backend_name for f in facts] == list(got.said)
    assert {f.backend_name: said_of(f.phase, f.reason, f.message) for f in facts} == got.said
    assert {p for p, _, _ in got.said.values()} == {"SUCCEEDED", "RUNNING", "STARTING", "PENDING",
                                                 "LOST"}
    lost = got.fact("isthmus-gone-1")
    assert lost is not None and lost.phase is Phase.LOST
    assert lost.reason is Reason.Orchestration and lost.message
    assert got.fact("isthmus-unknown-1") is None
    assert got.newest == b.clock.now == max(f.observed_at for f in facts)
    assert [b.lookup(n) for n in got.said if n != "isthmus-gone-1"] == facts[:4]


def test_facts_are_built_when_read_from_what_was_observed() -> None:
    b = _sim()
    got = b.observe()
    assert isinstance(got, Observed) and got._built == {}  # nothing built yet
    before = {n: b.lookup(n) for n in got.said}
    b.cancel("isthmus-j2-1", grace_seconds=0)
    b.advance(500)  # j3 starts running, j4 starts
    assert b.lookup("isthmus-j2-1").phase is Phase.CANCELLED  # type: ignore[union-attr]
    running = got.fact("isthmus-j2-1")
    assert running is not None and running == before["isthmus-j2-1"]
    assert running.phase is Phase.RUNNING and running.ended_at is None
    assert list(got._built) == ["isthmus-j2-1"]  # only the one read
    assert list(got) == list(before.values())
