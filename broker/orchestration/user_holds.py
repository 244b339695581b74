"""A user's hold on a queued job and its release (scontrol hold / release, sbatch --hold).

A held job stays QUEUED with the reason JobHeldUser and takes no part in admission (the hold
phase of the cycle leaves it out; an admission decided before the hold committed is dropped
under the job's lock: broker.control.admission_writes). Only a QUEUED job can be held, as
Slurm holds only pending jobs; release puts it back to WaitingForAdmission.
"""

from __future__ import annotations

from broker.domain import JobState, Reason
from broker.domain.clock import utcnow
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import JobNotFound, set_state
from broker.store import batch, records, user_holds
from broker.store.db import Database
from broker.store.records import JobRecord


class NotQueued(Exception):
    """The job is not waiting: it cannot be held (or needs no release)."""

    def __init__(self, job_id: str, state: str, doing: str) -> None:
        super().__init__(f"job {job_id} is {state}: only a queued job can be {doing}")


def held_message(actor: str) -> str:
    return (f"held by {actor}: it waits until released (scontrol release ID, "
            "POST /v1/jobs/ID/release)")


def hold_job(db: Database, job_id: str, actor: str) -> JobRecord:
    """Hold a queued job (a second hold changes nothing). JobNotFound, NotQueued."""
    with db.write() as s, batch.held_effects(s) as effects:
        job = records.lock_job(s, job_id)
        if job is None:
            raise JobNotFound(job_id)
        if job.state != JobState.QUEUED.value:
            raise NotQueued(job_id, job.state, "held")
        now = utcnow()
        if user_holds.hold(s, job_id, actor, now):
            set_state(s, job_id, JobState.QUEUED, Reason.JobHeldUser, Cause("api", actor),
                      held_message(actor), now=now, locked=job)
    effects.run_effects()
    return job


def release_job(db: Database, job_id: str, actor: str) -> JobRecord:
    """Release a held job back to admission (an unheld queued job: nothing to do)."""
    with db.write() as s, batch.held_effects(s) as effects:
        job = records.lock_job(s, job_id)
        if job is None:
            raise JobNotFound(job_id)
        if job.state != JobState.QUEUED.value:
            raise NotQueued(job_id, job.state, "released")
        now = utcnow()
        if user_holds.release(s, job_id):
            set_state(s, job_id, JobState.QUEUED, Reason.WaitingForAdmission,
                      Cause("api", actor), f"released by {actor}; waiting for the next "
                      "admission cycle", now=now, locked=job)
    effects.run_effects()
    return job
