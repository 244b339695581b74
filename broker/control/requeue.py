"""Applying a decision to run a job again, in one place: after a failure or a preemption
(the retry engine, policies/retry.py, decides; `requeue_after` applies) and after a dispatch
the backend refused (`requeue_refused`, its own backoff). Both requeue through `requeue`: the
exclusions grow, the backoff is stored as the job's not-before time, and the job goes back
to QUEUED through set_state."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlmodel import Session

from broker.control.plane import ControlPlane
from broker.domain import FailureCategory, JobState, Reason
from broker.domain.attempts import Attempt, RunSnapshot
from broker.domain.exclusions import Exclusions
from broker.domain.timebox import add_seconds
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.policy_inputs import attempt_counts
from broker.store import attempts as att
from broker.store import records
from broker.store.queries import get_job
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


def requeue_after(plane: ControlPlane, job_id: str, a: att.AttemptRecord, *, preempted: bool,
                  failure: FailureCategory | None, now: datetime,
                  blamed: tuple[str, ...] = ()) -> None:
    """After FAILED (or a preemption into RETRYING): ask the retry engine, apply its answer,
    in a transaction of its own (`retry`)."""
    with plane.db.write() as s:
        job = get_job(s, job_id)
        if job is not None:
            retry(s, plane, job, a, preempted=preempted, failure=failure, now=now,
                  blamed=blamed)


def retry(s: Session, plane: ControlPlane, job: JobRecord, a: att.AttemptRecord, *,
          preempted: bool, failure: FailureCategory | None, now: datetime,
          blamed: tuple[str, ...] = (), locked: bool = False) -> None:
    """The retry engine's answer for `job` after its attempt `a` ended, applied in the
    caller's transaction. `blamed`: the nodes the backend blamed for the failure; the retry
    avoids only those, else every node of the attempt's placement. `locked`: `job` is the
    caller's record of the job it holds locked (kept up to date in place by set_state)."""
    job_id = job.id
    spec = plane.spec(job_id, job.spec_json)
    history = []
    wasted = 0.0
    for r in att.attempts_of(s, job_id):
        if r.failure is None and not r.preempted:
            continue
        history.append(Attempt(
            job_id=job_id, number=r.number,
            snapshot=RunSnapshot.model_validate_json(r.snapshot_json),
            created_at=r.created_at,
            failure=FailureCategory(r.failure) if r.failure else None,
            preempted=r.preempted,
        ))
        if r.failure:
            wasted += _hours(r.gpus, r.started_at or r.dispatched_at, r.ended_at or now)
    snapshot = RunSnapshot.model_validate_json(a.snapshot_json)
    nodes = blamed or (snapshot.placement.nodes if snapshot.placement else ())
    decision = decide_retry(
        spec.retry, failure, attempt_counts(history), wasted, preempted=preempted,
        pool=a.pool, nodes=nodes, params=plane.params.retry,
    )
    held = job if locked else None
    if not decision.retry:
        if preempted:  # RETRYING with nowhere to go: the policy ends it as a failure
            set_state(s, job_id, JobState.FAILED, decision.reason,
                      Cause("retry", "system:retry", key=f"stop:{a.number}"),
                      decision.message, now=now, locked=held)
        return  # FAILED stays FAILED; the failure reason is already on the job
    if JobState(job.state) is JobState.FAILED:
        set_state(s, job_id, JobState.RETRYING, Reason.RetryScheduled,
                  Cause("retry", "system:retry", key=f"retry:{a.number}"),
                  decision.message, now=now, locked=held)
    reason = Reason.BackoffAfterFailure if decision.delay_seconds else Reason.RetryScheduled
    requeue(s, job, decision.delay_seconds, reason,
            Cause("retry", "system:retry", key=f"requeue:{a.number}"), decision.message,
            now, pools=decision.exclude_pools, nodes=decision.exclude_nodes, locked=held)


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
