"""A failure and its retry commit together (issue 27): the reconcile pass that records an
attempt's failure also takes the retry engine's decision, in the same transaction, and records
it on the attempt; endings an older version left undecided are caught up by the leader's
repair (broker.control.requeue.repair_undecided)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.control import preempt_batch, requeue
from broker.control.admission import run_admission
from broker.control.reconcile import run_reconcile
from broker.domain import JobState, Reason
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store.queries import job_events
from tests.builders import SpecBuilder, spec
from tests.harness.sim import Sim, attempts_of, consistent, cycle, run_until, state, submit


def _fail_its_node(sim: Sim, job_id: str) -> att.AttemptRecord:
    a = attempts_of(sim, job_id)[-1]
    k8s = sim.backends["sim-k8s"]
    k8s.fail_node(k8s.jobs[a.backend_name].nodes[0])
    sim.advance(30)
    return a


def _commits(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the write transactions the plane opens from now on."""
    db, opened = sim.plane.db, [0]
    write = db.write

    def counted(*a: Any, **k: Any) -> Any:
        opened[0] += 1
        return write(*a, **k)

    monkeypatch.setattr(db, "write", counted)
    return opened


def test_the_pass_that_records_a_failure_requeues_the_job_in_the_same_transaction(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    job = submit(sim, spec().name("flaky").flavors("a100-80g").replicas(1).topology(None), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = _fail_its_node(sim, job)
    opened = _commits(sim, monkeypatch)
    run_reconcile(sim.plane, "sim-k8s")
    assert opened[0] == 1  # one transaction: the fact, the failure and its retry
    assert state(sim, job) == ("QUEUED", "BackoffAfterFailure")
    with sim.plane.db.read() as s:
        moves = [(e.from_state, e.to_state) for e in job_events(s, job)][-3:]
        ended = att.get_attempt(s, job, a.number)
    assert moves == [("RUNNING", "FAILED"), ("FAILED", "RETRYING"), ("RETRYING", "QUEUED")]
    assert ended is not None and ended.retry_decision == requeue.RETRY
    consistent(sim)


def test_a_user_error_records_that_it_is_not_retried(sim: Sim) -> None:
    job = submit(sim, spec().name("buggy").flavors("a100-80g").replicas(1).topology(None)
                 .set("annotations", {"isthmus.io/sim-fail": "oom"}), 600)
    run_until(sim, job, "FAILED", step=20)
    with sim.plane.db.read() as s:
        decided = [a.retry_decision for a in att.attempts_of(s, job)]
    assert decided[-1] in (requeue.STOP, requeue.RETRY)
    assert all(d is not None for d in decided)


def _leave_undecided(sim: Sim, job_id: str, a: att.AttemptRecord) -> None:
    """What an older version left after a crash: the failure committed, no retry asked."""
    now = sim.clock.now
    with sim.plane.db.write() as s:
        att.update(s, job_id, a.number, ended_at=now, failure="INFRA_TRANSIENT",
                   phase="FAILED")
        set_state(s, job_id, JobState.FAILED, Reason.InfraTransient,
                  Cause("reconciler", "system:reconciler", key="old-version"),
                  "node lost", now=now)


def _running_then_left_undecided(sim: Sim,
                                 builder: SpecBuilder) -> tuple[str, att.AttemptRecord]:
    """A 1-replica job run to RUNNING, then its attempt failed the way an older version left
    it: the job and its ended attempt."""
    job = submit(sim, builder.flavors("a100-80g").replicas(1).topology(None), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    _leave_undecided(sim, job, a)
    return job, a


def test_the_repair_retries_a_failure_an_older_version_left_undecided(sim: Sim) -> None:
    job, a = _running_then_left_undecided(sim, spec().name("left"))
    assert requeue.repair_undecided(sim.plane) == 1
    assert state(sim, job)[0] == "QUEUED"
    with sim.plane.db.read() as s:
        assert att.get_attempt(s, job, a.number).retry_decision == requeue.RETRY  # type: ignore[union-attr]
        assert att.undecided(s) == []
    assert requeue.repair_undecided(sim.plane) == 0  # nothing twice
    run_until(sim, job, "SUCCEEDED", step=60)
    consistent(sim)


def test_the_repair_records_a_stop_and_leaves_the_job_failed(sim: Sim) -> None:
    job, a = _running_then_left_undecided(
        sim, spec().name("spent").set("retry", {"max_attempts": 1}))
    assert requeue.repair_undecided(sim.plane) == 1
    assert state(sim, job)[0] == "FAILED"
    with sim.plane.db.read() as s:
        assert att.get_attempt(s, job, a.number).retry_decision == requeue.STOP  # type: ignore[union-attr]


def test_the_repair_leaves_alone_an_ending_whose_job_moved_on(sim: Sim) -> None:
    job, a = _running_then_left_undecided(sim, spec().name("moved"))
    with sim.plane.db.write() as s:  # requeued by the old code's own later transaction
        now = sim.clock.now
        for to in (JobState.RETRYING, JobState.QUEUED):
            set_state(s, job, to, Reason.RetryScheduled,
                      Cause("retry", "system:retry", key=f"old-{to.value}"), now=now)
    assert requeue.repair_undecided(sim.plane) == 0
    assert state(sim, job)[0] == "QUEUED"
    with sim.plane.db.read() as s:
        assert att.get_attempt(s, job, a.number).retry_decision == requeue.NONE  # type: ignore[union-attr]


def test_a_preemption_cut_between_its_signal_and_its_commit_is_still_a_preemption(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """The victim's object is signalled, then the process dies before the preemption is
    recorded (its write never happens): the object's ending, whatever the backend calls it,
    is read as the preemption (the intent committed before the signal), so the job is
    requeued, not ended as cancelled or failed."""
    low = submit(sim, spec().name("low").flavors("h100-80g").replicas(4).topology(None)
                 .set("priority", "low"), 3600)
    run_until(sim, low, "RUNNING", step=20)
    cycle(sim, 700)  # past the minimum run time before preemption
    monkeypatch.setattr(preempt_batch, "_write", lambda *a, **k: None)  # killed here
    submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
           .set("priority", "high"), 60)
    run_admission(sim.plane)
    monkeypatch.undo()
    assert state(sim, low)[0] == "RUNNING"  # nothing recorded: the write was cut
    for _ in range(10):
        sim.advance(30)
        run_reconcile(sim.plane, "sim-slurm")
        if state(sim, low)[0] != "RUNNING":
            break
    assert state(sim, low)[0] in ("QUEUED", "ADMITTED", "PREPARING", "RUNNING")
    with sim.plane.db.read() as s:
        first = att.get_attempt(s, low, 1)
        moves = [e.to_state for e in job_events(s, low)]
    assert first is not None and first.preempted and first.ended_at is not None
    assert "RETRYING" in moves and "CANCELLED" not in moves and "FAILED" not in moves
    consistent(sim)
