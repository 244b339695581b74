"""A user's request to requeue a running job (scontrol requeue / requeuehold).

Slurm's ``scontrol requeue`` stops a batch job and puts it back to pending under the same id;
``requeuehold`` also holds it. Here the request is recorded under the job's lock (one row in
job_requeues, for the job's current attempt); the admission cycle stops that attempt with the
job's grace and, in one transaction, ends it and moves the job RETRYING -> QUEUED (reason
Requeued, or JobHeldUser for requeuehold): broker.control.user_requeue. Only a job holding GPUs
(ADMITTED, PREPARING, RUNNING) can be requeued. A job that waits has nothing to stop (Slurm
answers "Job is pending execution"); a job that ended stays ended, as every ending here is
final (Slurm can requeue a finished batch job it still remembers: here it is submitted again).
"""

from __future__ import annotations

from broker.domain import HOLDING, TERMINAL, JobState
from broker.domain.clock import utcnow
from broker.orchestration.transitions import JobNotFound
from broker.store import records, requeue_requests
from broker.store.db import Database
from broker.store.records import JobRecord
from broker.store.requeue_requests import RequeueRequest


class NotRequeueable(Exception):
    """The job holds no attempt to stop: it waits, or it has ended."""

    def __init__(self, job_id: str, state: str) -> None:
        why = ("it has ended, and an ending is final: submit it again" if JobState(state)
               in TERMINAL else "it is pending execution: there is nothing to stop")
        super().__init__(f"job {job_id} is {state}: only a job that was admitted or runs "
                         f"can be requeued; {why}")
        self.ended = JobState(state) in TERMINAL


def requeue_job(db: Database, job_id: str, actor: str, hold: bool) -> JobRecord:
    """Ask for the job's current attempt to be stopped and the job requeued (held if `hold`).
    The job changes when the next admission cycle carries it out. JobNotFound,
    NotRequeueable."""
    with db.write() as s:
        job = records.lock_job(s, job_id)
        if job is None:
            raise JobNotFound(job_id)
        if JobState(job.state) not in HOLDING:
            raise NotRequeueable(job_id, job.state)
        requeue_requests.ask(s, RequeueRequest(job_id, job.attempt, actor, hold, utcnow()))
    return job
