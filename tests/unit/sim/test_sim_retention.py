"""The simulator forgets what it has run, as slurmctld does (MinJobAge): an ended job stays
among its jobs for `retention_s`, then an Isthmus job is answered from a bounded accounting and
a foreign one is gone. Before, every job it had ever run stayed, and every `observe` went
through them all (the soak's leader grew about 20 MB a minute at 100 jobs/s)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from backends.base import Observed
from backends.sim import SimBackend, SimClock, SimFailures, SimPoolSpec
from backends.sim import backend as sim_backend
from broker.domain.facts import Phase
from tests.harness.requests import sim_request

T0 = datetime(2025, 1, 1, tzinfo=UTC)
POOL = SimPoolSpec("p1", "h100", blocks=1, racks_per_block=2, nodes_per_rack=2, gpus_per_node=8)


def _sim() -> SimBackend:
    return SimBackend("sim-a", "slurm", [POOL], SimClock(T0), seed=3,
                      failures=SimFailures(start_delay_s=0), retention_s=300)


def test_an_ended_job_leaves_the_jobs_after_its_retention_and_is_still_answered() -> None:
    b = _sim()
    b.submit(sim_request(1, duration=10))
    b.submit(sim_request(2, duration=10_000))
    name, running = "isthmus-j1-1", "isthmus-j2-1"
    b.advance(20)
    assert name in b.jobs and name in {f.backend_name for f in b.observe()}

    b.advance(280)  # t 300; ended at 10: retained until 310
    assert name in b.jobs
    b.advance(11)
    assert name not in b.jobs and name in b.accounting
    # a plain observe no longer goes through it; asked for by name, it is what it was
    assert {f.backend_name for f in b.observe()} == {running}
    asked = b.observe([name, running])
    assert isinstance(asked, Observed)
    fact = asked.fact(name)
    assert fact is not None and fact.phase is Phase.SUCCEEDED, fact
    looked = b.lookup(name)
    assert looked is not None and looked.phase is Phase.SUCCEEDED
    assert b.logs(name)
    assert b.cancel(name, 0).found  # "already ended", not "no such job"
    # a resubmission of the same attempt is adopted, not run twice
    assert b.submit(sim_request(1, duration=10)).adopted
    assert running in b.jobs  # a running job is never retired


def test_the_accounting_is_bounded_and_foreign_jobs_are_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_backend, "ACCOUNTING_MAX", 2)
    b = _sim()
    for n in (1, 2, 3):
        b.submit(sim_request(n, duration=10))
        b.advance(20)  # each ends before the next starts, in order
    foreign = b.foreign_job("p1", 1, 8, duration=5, limit=None)
    b.enqueue(foreign)
    b.advance(400)
    assert list(b.accounting) == ["isthmus-j2-1", "isthmus-j3-1"]  # j1, the oldest, dropped
    assert foreign.name not in b.jobs and foreign.name not in b.accounting
    gone = b.observe(["isthmus-j1-1"])
    assert [f.phase for f in gone] == [Phase.LOST]
    assert b.lookup("isthmus-j1-1") is None


def test_start_and_end_events_are_kept_only_when_asked_for_and_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="keeps no events"):
        _sim().drain_events()  # nothing drains a served backend's: none are kept
    monkeypatch.setattr(sim_backend, "EVENTS_MAX", 3)
    b = SimBackend("sim-a", "slurm", [POOL], SimClock(T0), seed=3,
                   failures=SimFailures(start_delay_s=0), events=True)
    for n in (1, 2):
        b.submit(sim_request(n, duration=10))
        b.advance(20)
    # four events, nobody drained them: the newest three are kept
    assert b.drain_events() == [("isthmus-j1-1", "end"), ("isthmus-j2-1", "start"),
                                ("isthmus-j2-1", "end")]
    assert b.drain_events() == []


def test_a_job_cancelled_and_retired_before_its_natural_end_and_its_name_reused() -> None:
    b = _sim()
    b.submit(sim_request(1, duration=1000))
    b.advance(10)
    b.cancel("isthmus-j1-1", 0)  # its end at 1000 stays in the heap
    b.advance(400)  # retired, then out of the accounting: the name can be used again
    b.accounting.clear()
    assert not b.submit(sim_request(1, duration=5000)).adopted  # the same name, a new job
    b.advance(700)  # past the first job's natural end (1000): the stale entry is not this job's
    again = b.lookup("isthmus-j1-1")
    assert again is not None and again.phase is Phase.RUNNING, again
