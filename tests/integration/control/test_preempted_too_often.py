"""A job preempted more often than the retry policy allows ends FAILED with RetriesExhausted
(RETRYING -> FAILED, on the retry engine's decision), not CANCELLED as if a person had
stopped it."""

from __future__ import annotations

from datetime import timedelta

from broker.control.requeue import STOP, retry
from broker.domain import JobState, Reason
from broker.domain.attempts import RunSnapshot
from broker.domain.spec import JobSpec
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import records
from broker.store.queries import get_job, job_events
from policies.retry import RetryParams
from tests.builders import insert_job_in_state
from tests.harness.sim import Sim


def test_a_job_preempted_too_often_fails_with_retries_exhausted(sim: Sim) -> None:
    db, now = sim.plane.db, sim.clock.now
    preemptions = RetryParams().max_preemptions + 1
    with db.write() as s:
        job_id = insert_job_in_state(s, JobState.RETRYING, Reason.Preempted)
        job = get_job(s, job_id)
        assert job is not None
        snapshot = RunSnapshot.of(JobSpec.model_validate_json(job.spec_json))
        for n in range(1, preemptions + 1):
            att.insert_attempt(s, att.AttemptRecord(
                job_id=job_id, number=n, snapshot_json=snapshot.model_dump_json(),
                spec_hash=job.spec_hash, backend_name=f"isthmus-{job_id}-{n}",
                created_at=now - timedelta(minutes=preemptions - n + 1), backend="sim-slurm",
                pool="slurm-h100", flavor="h100-80g", gpus=8, dispatch=att.CREATED,
                phase="PREEMPTED", preempted=True, ended_at=now,
            ))
        last = att.get_attempt(s, job_id, preemptions)
    assert last is not None
    with db.write() as s:
        locked = records.lock_job(s, job_id)
        assert locked is not None
        assert retry(s, sim.plane, locked, last, preempted=True, failure=None, now=now,
                     locked=True) == STOP
    with db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        assert (job.state, job.reason) == (JobState.FAILED, Reason.RetriesExhausted.value)
        assert f"preempted {preemptions} times" in job.message
        last_event = job_events(s, job_id)[-1]
        assert (last_event.from_state, last_event.to_state) == ("RETRYING", "FAILED")


def test_only_the_retry_engine_fails_a_job_waiting_for_its_retry(sim: Sim) -> None:
    with sim.plane.db.write() as s:
        job_id = insert_job_in_state(s, JobState.RETRYING, Reason.Preempted)
        refused = set_state(s, job_id, JobState.FAILED, Reason.UserError, Cause("api", "user"))
        assert not refused.accepted and refused.reason is Reason.RetryNotDecided
        ok = set_state(s, job_id, JobState.FAILED, Reason.RetriesExhausted,
                       Cause("retry", "system:retry"), "no retry budget left")
        assert ok.accepted
