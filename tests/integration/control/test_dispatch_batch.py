"""Issue 17, the soak: the dispatcher recorded each object it made in a transaction of its own
(a read, a write, a commit and a lease check per job). A pass now reads its intents' jobs once
and records the objects it made together, each job in its savepoint: one whose record fails is
requeued alone, as a failed dispatch always was."""

from __future__ import annotations

from typing import Any

import pytest

from broker.control import dispatch
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.domain import JobState, Reason
from broker.orchestration import transitions
from broker.orchestration.rules import Cause
from broker.store import attempts as att
from broker.store.queries import get_job
from broker.store.secrets import server_secret
from tests.builders import spec
from tests.harness.sim import Sim, consistent, state, submit
from tests.harness.statements import statements_sent, transactions_opened
from tests.integration.control.poison import events


def _admitted(sim: Sim, n: int) -> list[str]:
    jobs = [submit(sim, spec().name(f"d{i}").flavors("a100-80g").replicas(1).gpus(1)
                   .topology(None)) for i in range(n)]
    run_admission(sim.plane)
    assert all(state(sim, j)[0] == "ADMITTED" for j in jobs)
    return jobs


def _count_writes(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    server_secret(sim.plane.db, "progress")  # made once, on first use: not the pass's write
    return transactions_opened(sim.plane.db, "write", monkeypatch)


def test_a_pass_records_its_objects_in_one_transaction(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _admitted(sim, 12)
    writes = _count_writes(sim, monkeypatch)
    monkeypatch.setattr(dispatch, "RECORD_AFTER_S", 3600.0)
    assert run_dispatch(sim.plane) == 12
    assert writes[0] == 1
    for j in jobs:
        assert state(sim, j) == ("PREPARING", "BackendPending")
    consistent(sim)


def test_a_record_sends_its_writes_once_not_per_object(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record's attempts, events and job states go as one executemany each, and whether
    its causes were applied before is asked in one statement (four statements per object
    before)."""
    jobs = _admitted(sim, 6)
    server_secret(sim.plane.db, "progress")
    monkeypatch.setattr(dispatch, "RECORD_AFTER_S", 3600.0)
    with statements_sent() as sent:
        assert run_dispatch(sim.plane) == 6
    for table in ("UPDATE attempts SET", "INSERT INTO job_events", "UPDATE jobs SET"):
        assert [n for sql, n in sent if sql.startswith(table)] == [6], (table, sent)
    assert len([sql for sql, _ in sent if sql.startswith("SELECT job_events")]) == 1, sent
    for j in jobs:
        assert state(sim, j) == ("PREPARING", "BackendPending")
    consistent(sim)


def test_the_progress_secret_is_read_once_not_every_pass(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The secret the progress tokens derive from never changes once made: the first pass
    reads it, the next ones derive from the same key without a transaction of their own."""
    monkeypatch.setattr(dispatch, "RECORD_AFTER_S", 3600.0)
    reads = []
    for i in range(3):
        job = submit(sim, spec().name(f"e{i}").flavors("a100-80g").replicas(1).gpus(1)
                     .topology(None))
        run_admission(sim.plane)
        with statements_sent() as sent:
            assert run_dispatch(sim.plane) == 1
        assert state(sim, job) == ("PREPARING", "BackendPending")
        reads.append(len([sql for sql, _ in sent if "FROM server_secrets" in sql]))
    assert reads == [1, 0, 0]
    key = server_secret(sim.plane.db, "progress")
    assert sim.plane.soft.progress_key == key
    assert "progress_key" not in repr(sim.plane.soft)


def test_records_are_cut_in_chunks(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    _admitted(sim, 12)
    writes = _count_writes(sim, monkeypatch)
    monkeypatch.setattr(dispatch, "RECORD_EVERY", 5)
    monkeypatch.setattr(dispatch, "RECORD_AFTER_S", 3600.0)
    assert run_dispatch(sim.plane) == 12
    assert writes[0] == 3  # 5 + 5 + 2


def test_a_record_that_fails_requeues_that_job_alone(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = _admitted(sim, 4)
    bad = jobs[2]
    original = transitions.set_state

    def fail_for_bad(s: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
        if job_id == bad and args[0].value == "PREPARING":
            raise RuntimeError("a bug met only by this job")
        return original(s, job_id, *args, **kwargs)

    monkeypatch.setattr(dispatch, "set_state", fail_for_bad)
    assert run_dispatch(sim.plane) == 3
    for j in jobs:
        if j != bad:
            assert state(sim, j) == ("PREPARING", "BackendPending")
    assert state(sim, bad) == ("QUEUED", "InternalError")
    assert "dispatch record (RuntimeError)" in events(sim, bad)[-1][2]
    consistent(sim)  # its reservation is released


def test_a_job_preempted_and_admitted_again_during_the_pass_keeps_its_new_attempt(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass reads its jobs once: a job preempted back to the queue (its intent abandoned)
    and admitted again while the pass makes other objects must not have the object of its
    old attempt recorded as its new attempt's (the record checks the job under its lock)."""
    first, moved = _admitted(sim, 2)
    with sim.plane.db.read() as s:
        old = get_job(s, moved)
    assert old is not None
    original = dispatch._dispatch

    def meanwhile(plane: Any, a: Any, key: bytes, job: Any) -> Any:
        if a.job_id == first:  # a concurrent admission cycle preempts `moved`, admits it again
            now = plane.clock()
            with plane.db.write() as s:
                att.update(s, moved, old.attempt, dispatch=att.ABANDONED, ended_at=now,
                           preempted=True)
                transitions.set_state(s, moved, JobState.QUEUED, Reason.Preempted,
                                      Cause("admission", "system:preemption"), now=now)
            run_admission(plane)
            assert state(sim, moved)[0] == "ADMITTED"
        return original(plane, a, key, job)

    monkeypatch.setattr(dispatch, "_dispatch", meanwhile)
    run_dispatch(sim.plane)
    with sim.plane.db.read() as s:
        stale = att.get_attempt(s, moved, old.attempt)
        job = get_job(s, moved)
    assert stale is not None and job is not None
    assert stale.dispatch == att.ABANDONED  # never recorded as made
    assert job.attempt == old.attempt + 1
    assert state(sim, moved)[0] == "ADMITTED"  # its new intent is still to be made
