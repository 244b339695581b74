"""Preemption carried out: the admission cycle names victims (policies.preemption); here each
victim's backend object gets its stop signal with the victim's grace, the job moves to
RETRYING (Preempted) and is requeued by the retry engine, which does not count preemptions as
failures. Its next attempt resumes from its checkpoint directory when the spec says resumable.
The victim's attempt is booked in the ledger here (waste:preempted since its last progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
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
from broker.domain.spec import JobSpec
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.policy_inputs import running_job
from broker.store import attempts as att
from broker.store import batch, records
from broker.store.queries import get_job, jobs_by_ids
from broker.store.records import JobRecord
from policies.preemption import Mode, PreemptionPlan, Preemptor, Victim
from policies.types import PendingJob, PoolRoom, QuotaConfig, RunningJob


@dataclass(frozen=True, slots=True)
class KeptView:
    """A live attempt's preemption view as last built, with what building it again needs
    when only its times moved: its job's parsed spec and the priority class its attempt was
    admitted as (both fixed for the attempt, as are its nodes and reservation)."""

    view: RunningJob
    spec: JobSpec
    admitted_as: str | None


def running_views(plane: ControlPlane) -> list[RunningJob]:
    """Admitted and running jobs as preemption sees them, from their live attempts. One
    narrow read of every such attempt's times; an attempt's snapshot, spec and reservation
    are read and parsed only the first time (they never change for an attempt:
    `SoftState.victim_views`). A job whose view cannot be built (its stored spec or snapshot
    does not parse) is left out, logged: it cannot be chosen as a victim, and it is not marked
    (it runs; its reason is the backend's to tell)."""
    config, kept_for = plane.config, plane.soft.victim_views
    # a view holds its priority from the configuration: a new one builds every view again
    before = kept_for[1] if kept_for is not None and kept_for[0] is config else {}
    with plane.db.read() as s:
        holding = att.holding(s)
        new = [(h.job_id, h.number) for h in holding if (h.job_id, h.number) not in before]
        built = _first_views(plane, s, new) if new else {}
    kept: dict[tuple[str, int], KeptView] = {}
    out: list[RunningJob] = []
    for h in holding:
        key = (h.job_id, h.number)
        seen = before.get(key) or built.get(key)
        if seen is None:
            continue  # its view could not be built (logged)
        started = h.started_at or h.dispatched_at or h.created_at
        if seen.view.started_at != started or seen.view.last_checkpoint_at != h.checkpoint_at:
            seen = replace(seen, view=_view(plane, seen.spec, seen.view.id, started,
                                            h.checkpoint_at, seen.admitted_as,
                                            flavor=seen.view.flavor, pool=seen.view.pool,
                                            borrowed=seen.view.borrowed, nodes=seen.view.nodes))
        kept[key] = seen
        out.append(seen.view)
    plane.soft.victim_views = (config, kept)
    return out


def _first_views(plane: ControlPlane, s: Session,
                 keys: list[tuple[str, int]]) -> dict[tuple[str, int], KeptView]:
    """The views of attempts seen for the first time: their rows, their jobs' specs and
    their reservations, a few statements for all of them."""
    attempts = att.by_keys(s, keys)
    jobs = jobs_by_ids(s, [a.job_id for a in attempts])
    borrowed = ledger.borrowed_of_many(s, keys)
    out: dict[tuple[str, int], KeptView] = {}
    for a in attempts:
        job = jobs.get(a.job_id)
        if job is None:
            continue
        with JobGuard("preemption view", job.id):
            snapshot = RunSnapshot.model_validate_json(a.snapshot_json)
            placement = snapshot.placement
            spec = plane.spec(job.id, job.spec_json)
            started = a.started_at or a.dispatched_at or a.created_at
            view = _view(plane, spec, job.id, started, a.checkpoint_at, snapshot.admitted_as,
                         flavor=a.flavor, pool=a.pool,
                         borrowed=borrowed.get((job.id, a.number), 0) > 0,
                         nodes=placement.nodes if placement else ())
            out[(a.job_id, a.number)] = KeptView(view, spec, snapshot.admitted_as)
    return out


def _view(plane: ControlPlane, spec: JobSpec, job_id: str, started: datetime,
          checkpoint_at: datetime | None, admitted_as: str | None, *, flavor: str, pool: str,
          borrowed: bool, nodes: Sequence[str]) -> RunningJob:
    return running_job(plane.config, job_id, spec, flavor=flavor, pool=pool,
                       started_at=started, last_checkpoint_at=checkpoint_at,
                       borrowed=borrowed, nodes=nodes, admitted_as=admitted_as)


def preempt(plane: ControlPlane, victim: Victim) -> bool:
    """Stop one victim: a read, its backend signal, one write transaction (its job locked,
    then its attempt read again, ended, charged and requeued). True when its job left the
    running states. The batch of a whole cycle is `preempt_all`; this is its fallback."""
    now = plane.clock()
    with plane.db.read() as s:
        job = get_job(s, victim.job_id)
        attempt = att.get_attempt(s, victim.job_id, job.attempt) if job else None
    if job is None or attempt is None or job.state not in HOLDING:
        return False
    mark_intents(plane, [attempt], now)
    signal = signal_victim(plane, victim, attempt)
    if signal is None:
        return False
    with plane.db.write() as s, batch.held_effects(s) as effects:
        # The job row first, then the attempt's rows, the order set_state, the reconciler and
        # the progress route take them: the attempt first deadlocked with a reconcile chunk
        # holding the job under the soak. The job may have moved on since the read above.
        locked = records.lock_job(s, job.id)
        fresh = att.get_attempt(s, job.id, attempt.number) if locked is not None else None
        ended = end_locked(s, plane, locked, fresh, attempt.number, victim, signal, now)
    effects.run_effects()  # once committed: a preemption done again counts once
    if ended:
        log.info("preempted %s (%s)", attempt.backend_name, victim.message)
    return ended


def mark_intents(plane: ControlPlane, attempts: list[att.AttemptRecord], now: datetime) -> None:
    """Commit the intent to stop these attempts before their objects are signalled: if the
    process dies after a signal and before the preemption's own commit, the reconciler reads
    the object's ending as this preemption (reconcile_apply), not as the job's own failure or
    a user's cancel. Only attempts with an object (the others have nothing to signal). The
    jobs' rows are locked first, as every writer of attempt rows here takes them."""
    made = sorted((a for a in attempts if a.dispatch == att.CREATED),
                  key=lambda a: a.job_id)
    if not made:
        return
    with plane.db.write() as s:
        records.lock_jobs(s, [a.job_id for a in made])
        for a in made:
            att.update(s, a.job_id, a.number, preempt_signalled_at=now)


def signal_victim(plane: ControlPlane, victim: Victim, attempt: att.AttemptRecord) -> bool | None:
    """Send the victim's backend object its stop signal with the victim's grace. True: sent;
    False: no object to signal (none made yet, or its backend is not configured); None: the
    object exists or may be made meanwhile and could not be signalled (a next cycle)."""
    backend = plane.backends.get(attempt.backend)
    if backend is None:
        return False
    if attempt.dispatch != att.CREATED:
        return False  # no object yet (or made after the read: end_locked sees it)
    try:
        backend.cancel(attempt.backend_name, victim.grace_seconds)
    except BackendUnavailable:
        log.warning("cannot signal victim %s: backend unreachable; retrying next cycle",
                    attempt.backend_name)
        return None
    return True


def end_locked(s: Session, plane: ControlPlane, locked: JobRecord | None,
               attempt: att.AttemptRecord | None, number: int, victim: Victim,
               signalled: bool, now: datetime) -> bool:
    """Under the job's lock, with its attempt `number` read again under it: the victim's job
    back to the queue (no object yet) or its attempt ended and charged and the job through
    RETRYING to what the retry engine says, in the caller's transaction. False when the job
    moved on since the victim was signalled (or its object was made meanwhile, unsignalled)."""
    if locked is None or attempt is None or locked.state not in HOLDING \
            or locked.attempt != number:
        return False
    if JobState(locked.state) is JobState.ADMITTED:  # no object yet: back to the queue
        att.update(s, locked.id, number, dispatch=att.ABANDONED, ended_at=now, preempted=True,
                   retry_decision=requeue.NONE)
        set_state(s, locked.id, JobState.QUEUED, Reason.Preempted,
                  Cause("admission", "system:preemption", key=f"preempt:{number}"),
                  victim.message, now=now, locked=locked)
        return True
    if not signalled and plane.backends.get(attempt.backend) is not None:
        return False  # its object was made after the read, unsignalled: a next cycle
    # Charged up to the signal: the attempt is over for Isthmus from here (the reconciler
    # no longer looks at it), so the grace it gets to checkpoint is not charged. The submitter
    # from the locked row: the ledger's own look-up was one more statement per victim.
    charge(s, plane, locked.team, attempt, ledger.Ending.PREEMPTED, now, now,
           submitted_by=locked.submitted_by)
    set_state(s, locked.id, JobState.RETRYING, Reason.Preempted,
              Cause("admission", "system:preemption", key=f"preempt:{number}"),
              victim.message, now=now, locked=locked)
    ended = replace(attempt, ended_at=now, preempted=True)
    decided = requeue.retry(s, plane, locked, ended, preempted=True, failure=None, now=now,
                            locked=True)
    att.update(s, locked.id, number, ended_at=now, preempted=True, retry_decision=decided)
    return True


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
