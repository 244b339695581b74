"""Applying a decision to run a job again, in one place: after a failure or a preemption
(the retry engine, policies/retry.py, decides; `retry` applies, in the transaction that ends
the attempt; `repair_undecided` catches up endings an older version left undecided) and after
a dispatch the backend refused (`requeue_refused`, its own backoff). Both requeue through
`requeue`: the exclusions grow, the backoff is stored as the job's not-before time, and the
job goes back to QUEUED through set_state."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlmodel import Session

from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane, log
from broker.domain import FailureCategory, JobState, Reason
from broker.domain.attempts import Attempt
from broker.domain.exclusions import Exclusions
from broker.domain.timebox import add_seconds
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.policy_inputs import attempt_counts
from broker.store import attempts as att
from broker.store import records
from broker.store.records import JobRecord
from policies.retry import decide_retry

DISPATCHER = "system:dispatcher"
"""The dispatcher's name as an actor (broker/control/dispatch.py)."""
REFUSAL_BACKOFF_S = 10
REFUSAL_BACKOFF_MAX_S = 600


def requeue(s: Session, job: JobRecord, delay_s: float, reason: Reason, cause: Cause,
            message: str, now: datetime, *, pools: Iterable[str] = (),
            nodes: Iterable[str] = (), locked: JobRecord | None = None) -> None:
    """Back to QUEUED, not before `delay_s` from now, avoiding `pools` and `nodes` from now
    on (besides what the job avoids already). `locked`: as for set_state."""
    exclude = Exclusions.from_json(job.exclude_json).adding(pools, nodes)
    not_before = add_seconds(now, delay_s)  # a stored backoff may be absurd
    records.set_retry_terms(s, job.id, not_before, exclude.to_json())
    set_state(s, job.id, JobState.QUEUED, reason, cause, message, now=now, locked=locked)


def _hours(gpus: int, start: datetime | None, end: datetime) -> float:
    if start is None:
        return 0.0
    return max(0.0, (end - start).total_seconds()) / 3600 * gpus


RETRY, STOP, NONE = "retry", "stop", "none"
"""The retry decision recorded on an attempt that ended in a failure or a preemption
(attempts.retry_decision): the job goes again, the job ends, or there was no retry question
(the job had moved on, or went back to the queue before its object was made)."""
CAUSE_KINDS = ("retry", "requeue", "stop")
"""The kinds of the cause keys (`<kind>:<attempt>`) of `retry`'s transitions: a caller that
ends many attempts reads them ahead at once (broker.store.cause_lookups)."""


def retry(s: Session, plane: ControlPlane, job: JobRecord, ended: att.AttemptRecord, *,
          preempted: bool, failure: FailureCategory | None, now: datetime,
          blamed: tuple[str, ...] = (), locked: bool = False) -> str:
    """The retry engine's answer for `job` after its attempt `ended` ended, applied in the
    caller's transaction: the transaction that ends the attempt, so that a failure and its
    retry commit together (nothing in between for a crash to cut). `ended` is the attempt as
    it ends (its ending may not be written yet: it stands in for its own row here). `blamed`:
    the nodes the backend blamed for the failure; the retry avoids only those, else every node
    of the attempt's placement. `locked`: `job` is the caller's record of the job it holds
    locked (kept up to date in place by set_state). Returns the decision (RETRY or STOP) for
    the caller to record on the attempt (att.update ..., retry_decision=)."""
    job_id = job.id
    spec = plane.spec(job_id, job.spec_json)
    history = []
    wasted = 0.0
    snapshot = plane.snapshot(ended, last=True)  # kept from dispatch when it never ran
    for r in att.attempts_of(s, job_id):
        if r.number == ended.number:
            r = ended
        if r.failure is None and not r.preempted:
            continue
        history.append(Attempt(
            job_id=job_id, number=r.number,
            snapshot=snapshot if r.number == ended.number else plane.snapshot(r),
            created_at=r.created_at,
            failure=FailureCategory(r.failure) if r.failure else None,
            preempted=r.preempted,
        ))
        if r.failure:
            wasted += _hours(r.gpus, r.started_at or r.dispatched_at, r.ended_at or now)
    nodes = blamed or (snapshot.placement.nodes if snapshot.placement else ())
    decision = decide_retry(
        spec.retry, failure, attempt_counts(history), wasted, preempted=preempted,
        pool=ended.pool, nodes=nodes, params=plane.params.retry,
    )
    held = job if locked else None
    n = ended.number
    if not decision.retry:
        if preempted:  # RETRYING with nowhere to go: the policy ends it as a failure
            set_state(s, job_id, JobState.FAILED, decision.reason,
                      Cause("retry", "system:retry", key=f"stop:{n}"),
                      decision.message, now=now, locked=held)
        return STOP  # FAILED stays FAILED; the failure reason is already on the job
    if JobState(job.state) is JobState.FAILED:
        set_state(s, job_id, JobState.RETRYING, Reason.RetryScheduled,
                  Cause("retry", "system:retry", key=f"retry:{n}"),
                  decision.message, now=now, locked=held)
    reason = Reason.BackoffAfterFailure if decision.delay_seconds else Reason.RetryScheduled
    requeue(s, job, decision.delay_seconds, reason,
            Cause("retry", "system:retry", key=f"requeue:{n}"), decision.message,
            now, pools=decision.exclude_pools, nodes=decision.exclude_nodes, locked=held)
    return RETRY


def repair_undecided(plane: ControlPlane) -> int:
    """Ask the retry engine for the endings left undecided, and apply its answers: the
    current attempt of a job FAILED or RETRYING, ended in a failure or a preemption, with no
    decision recorded. Only a version older than the one that decides in the ending's own
    transaction leaves such rows (revision 0014 leaves them NULL for this); the leader runs
    this when it starts leading and then on an interval. Each job in a transaction of its
    own, its row locked first and the attempt read again under the lock. The number of
    endings decided."""
    now = plane.clock()
    with plane.db.read() as s:
        keys = att.undecided(s)
    done = 0
    for job_id, number in keys:
        with JobGuard("retry repair", job_id), plane.db.write() as s:
            job = records.lock_job(s, job_id)
            a = att.get_attempt(s, job_id, number)
            if job is None or a is None or a.retry_decision is not None:
                continue
            if job.attempt != number or job.state not in (JobState.FAILED, JobState.RETRYING):
                att.update(s, job_id, number, retry_decision=NONE)
                continue
            failure = FailureCategory(a.failure) if a.failure else None
            # the nodes the backend blamed are not kept: the retry avoids the placement's
            decided = retry(s, plane, job, a, preempted=a.preempted, failure=failure,
                            now=now, locked=True)
            att.update(s, job_id, number, retry_decision=decided)
            log.warning("retry repair: job %s attempt %d ended undecided; the retry engine "
                        "says %s", job_id, number, decided)
            done += 1
    return done


def requeue_refused(plane: ControlPlane, a: att.AttemptRecord, why: str,
             reason: Reason = Reason.DispatchRefused) -> None:
    """The backend will not take this object: requeue, avoid that pool for this job, and back
    off, so a refusal cannot turn into a loop of attempts. If no other pool fits, the job
    waits and `explain` shows the pool as excluded, with the refusal in the events.

    Also the way out for an intent whose dispatch failed unexpectedly (`reason`
    InternalError): leaving ADMITTED releases its reservation at once, so a job that cannot be
    dispatched never holds quota; the same failure is likely in that pool again, so the pool
    is avoided, and another pool may serve the job. FAILED is not a move the lifecycle allows
    from ADMITTED, and it would end a job that may run elsewhere."""
    now = plane.clock()
    with plane.db.write() as s:
        # The job row first, then its attempt's: the order of set_state, the reconciler and a
        # preemption (the attempt first could deadlock with a preemption of this job)
        job = records.lock_job(s, a.job_id)
        att.update(s, a.job_id, a.number, dispatch=att.ABANDONED, ended_at=now)
        refusals = sum(1 for x in att.attempts_of(s, a.job_id) if x.dispatch == att.ABANDONED)
        if job is None:
            return
        delay = min(REFUSAL_BACKOFF_MAX_S, REFUSAL_BACKOFF_S * 2 ** (refusals - 1))
        requeue(s, job, delay, reason, Cause("dispatcher", DISPATCHER, key=f"refused:{a.number}"),
                f"{why}; pool {a.pool} is avoided for this job from now on", now,
                pools=(a.pool,))
