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

from sqlmodel import Session

from broker.domain import JobState, Reason, starts_attempt
from broker.domain.clock import utcnow
from broker.domain.reasons import REASONS
from broker.orchestration.policy import default_rules
from broker.orchestration.rules import (
    Cause,
    Outcome,
    Rule,
    RuleSet,
    Ruling,
    TransitionContext,
)
from broker.store import records
from broker.store.records import EventRecord, JobRecord


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id '{job_id}'")
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class TransitionResult:
    outcome: Outcome
    job: JobRecord
    event: EventRecord | None
    reason: Reason
    message: str
    retry_after: float | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT


_DEFAULT_RULES = default_rules()


def append_event(
    session: Session,
    job: JobRecord,
    src: JobState | None,
    dst: JobState,
    reason: Reason,
    message: str,
    cause: Cause,
    now: datetime,
) -> EventRecord:
    """Append the next event of `job` (the caller holds the job's lock)."""
    job.last_seq += 1
    event = EventRecord(
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
    records.insert_event(session, job, event)
    return event


def _already_applied(session: Session, job: JobRecord, key: str) -> EventRecord | None:
    if job.unsaved_events is not None:
        return next((e for e in job.unsaved_events if e.cause_key == key), None)
    return records.event_for_cause(session, job.id, key)


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
    locked: JobRecord | None = None,
) -> TransitionResult:
    """Propose `proposed` for the job; returns what happened. Never commits.

    `locked` is the caller's record of a job it already holds locked in this transaction
    (e.g. one it just created); it is updated in place.
    """
    if locked is not None and locked.id == job_id:
        job: JobRecord | None = locked
    else:
        job = records.lock_job(session, job_id)
    if job is None:
        raise JobNotFound(job_id)
    if message is None:
        message = REASONS[reason].summary
    if cause.key is not None:
        done = _already_applied(session, job, cause.key)
        if done is not None:
            return TransitionResult(Outcome.NOOP, job, done, Reason(done.reason), done.message)
    src = JobState(job.state)
    if src == proposed and job.reason == reason.value and job.message == message:
        return TransitionResult(Outcome.NOOP, job, None, reason, message)

    ctx = TransitionContext(
        session=session, job=job, src=src, dst=proposed, reason=reason, message=message,
        cause=cause, now=now or utcnow(),
    )
    ran: list[Rule] = []
    for rule in (rules or _DEFAULT_RULES).for_transition(src, proposed):
        decision: Ruling | None = rule.before(ctx)
        ran.append(rule)
        if decision is not None and decision.outcome is not Outcome.ACCEPT:
            for done_rule in reversed(ran):
                done_rule.cleanup(ctx)
            return TransitionResult(
                decision.outcome, job, None, decision.reason, decision.message,
                decision.retry_after,
            )

    if starts_attempt(src, proposed):
        job.attempt += 1
    job.state = proposed.value
    job.reason = reason.value
    job.message = message
    job.updated_at = ctx.now
    event = append_event(session, job, src, proposed, reason, message, cause, ctx.now)
    records.save_state(session, job)
    for rule in ran:
        rule.after(ctx)
    return TransitionResult(Outcome.ACCEPT, job, event, reason, message)
