"""Preemption carried out: the admission cycle names victims (policies.preemption); here each
victim's backend object gets its stop signal with the victim's grace, the job moves to
RETRYING (Preempted) and is requeued by the retry engine, which does not count preemptions as
failures. Its next attempt resumes from its checkpoint directory when the spec says resumable.
The victim's attempt is booked in the ledger here (waste:preempted since its last progress).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from backends.base import BackendUnavailable
from broker import ledger
from broker.control import requeue
from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.reconcile import charge
from broker.domain import HOLDING, JobState, Reason
from broker.domain.attempts import RunSnapshot
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.policy_inputs import running_job
from broker.store import attempts as att
from broker.store import batch, records
from broker.store.queries import get_job, jobs_by_ids
from broker.store.records import JobRecord
from policies.preemption import Mode, PreemptionPlan, Preemptor, Victim
from policies.types import PendingJob, PoolRoom, QuotaConfig, RunningJob


def running_views(plane: ControlPlane) -> list[RunningJob]:
    """Admitted and running jobs as preemption sees them, from their live attempts. A job
    whose view cannot be built (its stored spec or snapshot does not parse) is left out,
    logged: it cannot be chosen as a victim, and it is not marked (it runs; its reason is the
    backend's to tell)."""
    out: list[RunningJob] = []
    with plane.db.read() as s:
        live = att.live(s)
        jobs = jobs_by_ids(s, [a.job_id for a in live])
        for a in live:
            job = jobs.get(a.job_id)
            if job is None or job.state not in HOLDING or job.attempt != a.number:
                continue
            with JobGuard("preemption view", job.id):
                snapshot = RunSnapshot.model_validate_json(a.snapshot_json)
                placement = snapshot.placement
                out.append(
                    running_job(
                        plane.config, job.id, plane.spec(job.id, job.spec_json),
                        flavor=a.flavor, pool=a.pool,
                        started_at=a.started_at or a.dispatched_at or a.created_at,
                        last_checkpoint_at=a.checkpoint_at,
                        borrowed=ledger.borrowed_of(s, job.id, a.number) > 0,
                        nodes=placement.nodes if placement else (),
                    )
                )
    return out


def preempt(plane: ControlPlane, victim: Victim) -> bool:
    """Stop one victim. True when its job left the running states."""
    now = plane.clock()
    with plane.db.read() as s:
        job = get_job(s, victim.job_id)
        attempt = att.get_attempt(s, victim.job_id, job.attempt) if job else None
    if job is None or attempt is None or job.state not in HOLDING:
        return False
    backend = plane.backends.get(attempt.backend)
    signalled = backend is not None and attempt.dispatch == att.CREATED
    if backend is not None and signalled:
        try:
            backend.cancel(attempt.backend_name, victim.grace_seconds)
        except BackendUnavailable:
            log.warning("cannot signal victim %s: backend unreachable; retrying next cycle",
                        attempt.backend_name)
            return False
    ended: att.AttemptRecord | None = None
    with plane.db.write() as s, batch.held_effects(s) as effects:
        # The job row first, then the attempt's rows, the order set_state, the reconciler and
        # the progress route take them: the attempt first deadlocked with a reconcile chunk
        # holding the job under the soak. The job may have moved on since the read above.
        locked = records.lock_job(s, job.id)
        if locked is None or locked.state not in HOLDING or locked.attempt != attempt.number:
            return False
        if JobState(locked.state) is JobState.ADMITTED:  # no object yet: back to the queue
            att.update(s, job.id, attempt.number, dispatch=att.ABANDONED, ended_at=now,
                       preempted=True)
            set_state(s, job.id, JobState.QUEUED, Reason.Preempted,
                      Cause("admission", "system:preemption", key=f"preempt:{attempt.number}"),
                      victim.message, now=now, locked=locked)
        elif backend is not None and not signalled:
            return False  # its object was made after the read, unsignalled: a next cycle
        else:
            ended = _end_signalled(s, plane, locked, attempt.number, victim, now)
            if ended is None:
                return False
    effects.run_effects()  # once committed: a preemption done again counts once
    if ended is not None:
        requeue.requeue_after(plane, job.id, ended, preempted=True, failure=None, now=now)
        log.info("preempted %s (%s)", ended.backend_name, victim.message)
    return True


def _end_signalled(s: Session, plane: ControlPlane, locked: JobRecord, number: int,
                   victim: Victim, now: datetime) -> att.AttemptRecord | None:
    """The signalled victim's attempt ended and charged, its job RETRYING (the requeue follows
    the commit). The attempt is read again under the job's lock: it may have started since."""
    attempt = att.get_attempt(s, locked.id, number)
    if attempt is None:
        return None
    att.update(s, locked.id, number, ended_at=now, preempted=True)
    # Charged up to the signal: the attempt is over for Isthmus from here (the reconciler
    # no longer looks at it), so the grace it gets to checkpoint is not charged.
    charge(s, plane, locked.team, attempt, ledger.Ending.PREEMPTED, now, now)
    set_state(s, locked.id, JobState.RETRYING, Reason.Preempted,
              Cause("admission", "system:preemption", key=f"preempt:{number}"),
              victim.message, now=now, locked=locked)
    return attempt


class LazyPreemptor:
    """Builds the running-job views (one pass over every live attempt) only when a pending
    job actually asks about preemption; most cycles never do."""

    def __init__(self, plane: ControlPlane, quotas: QuotaConfig, now: datetime) -> None:
        self.plane, self.quotas, self.now = plane, quotas, now
        self._inner: Preemptor | None = None

    def plan(self, job: PendingJob, mode: Mode, gpus_needed: int, pool: str | None,
             flavor: str | None, room: PoolRoom | None = None) -> PreemptionPlan:
        """The plan for `job`; one that fails is "no plan" for this job alone, with the
        incident in its message (priority preemption appends that to the job's wait message;
        the log has it in every mode)."""
        with JobGuard("preemption planning", job.id) as guard:
            if self._inner is None:
                self._inner = Preemptor(running_views(self.plane), self.quotas, self.now,
                                        self.plane.params.preemption)
            return self._inner.plan(job, mode, gpus_needed, pool, flavor, room)
        assert guard.incident is not None
        return PreemptionPlan(False, (), 0, Reason.InternalError, guard.incident.message)
