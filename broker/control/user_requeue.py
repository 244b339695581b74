"""Requeues users asked for (scontrol requeue / requeuehold, POST /v1/jobs/{id}/requeue),
carried out by the admission cycle: the requested attempt's object gets the job's stop signal
and grace, then one transaction ends the attempt (booked as cancelled: its owner stopped it),
moves the job RETRYING -> QUEUED (reason Requeued; JobHeldUser with a hold for requeuehold)
and deletes the request. A requeue is not a failure and not a preemption: the retry policy
counts neither. The requests are read with the cycle's inputs (admission.cycle_inputs), so a
cycle with none costs nothing here.

The stop's intent is committed on the attempt before the signal (preempt.mark_intents): a
process that dies between the signal and the requeue's commit leaves the request, and the
reconciler reads the object's ending as a preemption, so the job is requeued either way; the
request, then stale, is dropped by the next cycle.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from backends.base import BackendUnavailable
from broker import ledger
from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.preempt import mark_intents
from broker.control.reconcile import charge
from broker.control.requeue import NONE, requeue
from broker.domain import HOLDING, JobState, Reason
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.orchestration.user_holds import held_message
from broker.store import attempts as att
from broker.store import batch, records, requeue_requests, user_holds
from broker.store.queries import get_job
from broker.store.records import JobRecord
from broker.store.requeue_requests import RequeueRequest


def carry_out(plane: ControlPlane, requests: list[RequeueRequest], now: datetime) -> int:
    """Each request's attempt stopped and its job requeued; the number requeued. A request
    whose job moved on (ended, or already on another attempt) is dropped; one whose backend
    cannot be reached waits for a next cycle."""
    done = 0
    for req in requests:
        with JobGuard("requeue", req.job_id):
            done += _one(plane, req, now)
    return done


def _one(plane: ControlPlane, req: RequeueRequest, now: datetime) -> int:
    with plane.db.read() as s:
        job = get_job(s, req.job_id)
        attempt = att.get_attempt(s, req.job_id, req.attempt)
    if job is None or attempt is None or job.attempt != req.attempt \
            or JobState(job.state) not in HOLDING or attempt.ended_at is not None:
        with plane.db.write() as s:
            requeue_requests.drop(s, req.job_id)
        return 0
    mark_intents(plane, [attempt], now)
    backend = plane.backends.get(attempt.backend)
    if backend is not None and attempt.dispatch == att.CREATED:
        grace = plane.spec(job.id, job.spec_json).checkpoint.grace
        try:
            backend.cancel(attempt.backend_name, grace)
        except BackendUnavailable:
            log.warning("cannot stop %s for its requeue: backend unreachable; next cycle",
                        attempt.backend_name)
            return 0
    with plane.db.write() as s, batch.held_effects(s) as effects:
        locked = records.lock_job(s, req.job_id)
        fresh = att.get_attempt(s, req.job_id, req.attempt)
        requeue_requests.drop(s, req.job_id)
        if locked is None or fresh is None or locked.attempt != req.attempt \
                or JobState(locked.state) not in HOLDING or fresh.ended_at is not None:
            return 0
        _requeue_locked(s, plane, locked, fresh, req, now)
    effects.run_effects()
    log.info("requeued %s (asked by %s%s)", attempt.backend_name, req.requested_by,
             ", held" if req.hold else "")
    return 1


def _requeue_locked(s: Session, plane: ControlPlane, job: JobRecord,
                    attempt: att.AttemptRecord, req: RequeueRequest, now: datetime) -> None:
    """Under the job's lock: its attempt ended and booked, the job back in the queue (through
    RETRYING once its object was prepared or ran; an admitted job goes back directly, as a
    preempted one does)."""
    said = f"requeued by {req.requested_by} (attempt {req.attempt} stopped)"
    if JobState(job.state) is JobState.ADMITTED:
        att.update(s, job.id, attempt.number, dispatch=att.ABANDONED, ended_at=now,
                   retry_decision=NONE)
    else:
        charge(s, plane, job.team, attempt, ledger.Ending.CANCELLED, now, now,
               submitted_by=job.submitted_by)
        set_state(s, job.id, JobState.RETRYING, Reason.Requeued,
                  Cause("api", req.requested_by, key=f"user-requeue:{req.attempt}"), said,
                  now=now, locked=job)
        att.update(s, job.id, attempt.number, ended_at=now, retry_decision=NONE)
    back = Cause("api", req.requested_by, key=f"user-requeued:{req.attempt}")
    if req.hold:
        user_holds.hold(s, job.id, req.requested_by, now)
        requeue(s, job, 0, Reason.JobHeldUser, back,
                f"{said}; {held_message(req.requested_by)}", now, locked=job)
    else:
        requeue(s, job, 0, Reason.Requeued, back, f"{said}; waiting for admission again",
                now, locked=job)
