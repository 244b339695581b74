"""`set_state`: the only code that changes a job's state.

Order of work, all inside the caller's transaction:
1. lock the job row (FOR UPDATE on PostgreSQL; SQLite write transactions hold the database
   write lock from BEGIN IMMEDIATE);
2. a cause already applied to this job (same cause key) is a NOOP, as is a proposal that would
   leave state, reason and message unchanged;
3. run the rules for (from, to): the first refusal stops the chain, and rules whose `before`
   already ran get their `cleanup`, newest first;
4. write the new state and append one event; run `after` hooks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlmodel import Session

from broker.domain import JobState, Reason
from broker.orchestration.rules import (
    Cause,
    Decision,
    Outcome,
    Rule,
    RuleSet,
    TransitionContext,
    default_rules,
)
from broker.store.tables import JobEventRow, JobRow, utcnow


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id '{job_id}'")
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class TransitionResult:
    outcome: Outcome
    job: JobRow
    event: JobEventRow | None
    reason: Reason
    message: str
    retry_after: float | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT


_DEFAULT_RULES = default_rules()


def lock_job(session: Session, job_id: str) -> JobRow:
    stmt = select(JobRow).where(JobRow.id == job_id).with_for_update()  # type: ignore[arg-type]
    job = session.execute(stmt).scalar_one_or_none()
    if job is None:
        raise JobNotFound(job_id)
    return job


def _event_for_cause(session: Session, job_id: str, key: str) -> JobEventRow | None:
    stmt = select(JobEventRow).where(
        JobEventRow.job_id == job_id,  # type: ignore[arg-type]
        JobEventRow.cause_key == key,  # type: ignore[arg-type]
    )
    return session.execute(stmt).scalar_one_or_none()


def append_event(
    session: Session,
    job: JobRow,
    src: JobState | None,
    dst: JobState,
    reason: Reason,
    message: str,
    cause: Cause,
    now: datetime,
) -> JobEventRow:
    job.last_seq += 1
    event = JobEventRow(
        job_id=job.id,
        seq=job.last_seq,
        at=now,
        from_state=src.value if src else None,
        to_state=dst.value,
        reason=reason.value,
        message=message,
        cause_kind=cause.kind,
        cause_key=cause.key,
        actor=cause.actor,
        attempt=job.attempt,
        facts_ref=cause.facts_ref,
        details_json=json.dumps(cause.details, sort_keys=True) if cause.details else None,
    )
    session.add(event)
    return event


def set_state(
    session: Session,
    job_id: str,
    proposed: JobState,
    reason: Reason,
    cause: Cause,
    message: str | None = None,
    *,
    rules: RuleSet | None = None,
    now: datetime | None = None,
) -> TransitionResult:
    """Propose `proposed` for the job; returns what happened. Never commits."""
    job = lock_job(session, job_id)
    if message is None:
        from broker.domain.reasons import REASONS

        message = REASONS[reason].summary
    if cause.key is not None:
        done = _event_for_cause(session, job_id, cause.key)
        if done is not None:
            return TransitionResult(
                Outcome.NOOP, job, done, Reason(done.reason), done.message
            )
    src = JobState(job.state)
    if src == proposed and job.reason == reason.value and job.message == message:
        return TransitionResult(Outcome.NOOP, job, None, reason, message)

    ctx = TransitionContext(
        session=session,
        job=job,
        src=src,
        dst=proposed,
        reason=reason,
        message=message,
        cause=cause,
        now=now or utcnow(),
    )
    ran: list[Rule] = []
    for rule in (rules or _DEFAULT_RULES).for_transition(src, proposed):
        decision: Decision | None = rule.before(ctx)
        ran.append(rule)
        if decision is not None and decision.outcome is not Outcome.ACCEPT:
            for done_rule in reversed(ran):
                done_rule.cleanup(ctx)
            return TransitionResult(
                decision.outcome, job, None, decision.reason, decision.message,
                decision.retry_after,
            )

    if proposed is JobState.ADMITTED and src is not JobState.ADMITTED:
        job.attempt += 1
    job.state = proposed.value
    job.reason = reason.value
    job.message = message
    job.updated_at = ctx.now
    event = append_event(session, job, src, proposed, reason, message, cause, ctx.now)
    session.flush()
    for rule in ran:
        rule.after(ctx)
    return TransitionResult(Outcome.ACCEPT, job, event, reason, message)
