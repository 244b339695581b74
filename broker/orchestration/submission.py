"""Submitting and cancelling jobs: the write paths behind the API and CLI.

A submission is one transaction: the job row and its SUBMITTED event, then VALIDATING, then
QUEUED or REJECTED, all through set_state. Either all of it is stored or none of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from broker.config import IsthmusConfig
from broker.domain import JobState, Reason
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from broker.feasibility import feasibility
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import TransitionResult, append_event, set_state
from broker.store.db import Database
from broker.store.tables import JobRow, utcnow


class IdempotencyConflict(Exception):
    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(
            f"Idempotency-Key '{key}' was already used for job {job_id} with a different body"
        )
        self.key = key
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class Submitted:
    job: JobRow
    created: bool


def _find_by_key(session: Session, team: str, key: str) -> JobRow | None:
    stmt = select(JobRow).where(JobRow.team == team, JobRow.idempotency_key == key)  # type: ignore[arg-type]
    return session.execute(stmt).scalar_one_or_none()


def _replay_of(session: Session, spec: JobSpec, spec_hash: str, key: str) -> JobRow | None:
    existing = _find_by_key(session, spec.team, key)
    if existing is None:
        return None
    if existing.spec_hash != spec_hash:
        raise IdempotencyConflict(key, existing.id)
    return existing


def _submit_once(
    db: Database, config: IsthmusConfig, spec: JobSpec, actor: str, key: str | None
) -> Submitted:
    spec_json = spec.canonical_json()
    spec_hash = spec.spec_hash()
    with db.write() as s:
        if key is not None:
            existing = _replay_of(s, spec, spec_hash, key)
            if existing is not None:
                return Submitted(existing, created=False)
        now = utcnow()
        job = JobRow(
            id=new_job_id(),
            name=spec.name,
            team=spec.team,
            queue=spec.queue,
            priority=spec.priority,
            state=JobState.SUBMITTED.value,
            reason=Reason.Submitted.value,
            message="accepted by the API",
            total_gpus=spec.gang.total_gpus,
            spec_json=spec_json,
            spec_hash=spec_hash,
            idempotency_key=key,
            submitted_by=actor,
            created_at=now,
            updated_at=now,
        )
        s.add(job)
        s.flush()  # the row must exist before its first event references it
        append_event(
            s, job, None, JobState.SUBMITTED, Reason.Submitted, job.message,
            Cause("api", actor, key="submit"), now,
        )
        s.flush()
        set_state(
            s, job.id, JobState.VALIDATING, Reason.Validating,
            Cause("validation", "system:validator", key="validate"), now=now,
        )
        verdict = feasibility(config, spec)
        dst = JobState.QUEUED if verdict.ok else JobState.REJECTED
        set_state(
            s, job.id, dst, verdict.reason,
            Cause("validation", "system:validator", key="validated"), verdict.message, now=now,
        )
        return Submitted(job, created=True)


def submit_job(
    db: Database, config: IsthmusConfig, spec: JobSpec, actor: str, key: str | None = None
) -> Submitted:
    """Store a new job (or return the one this idempotency key already made)."""
    try:
        return _submit_once(db, config, spec, actor, key)
    except IntegrityError:
        # A concurrent request with the same key won the race (PostgreSQL); answer as a replay.
        if key is None:
            raise
        with db.read() as s:
            existing = _replay_of(s, spec, spec.spec_hash(), key)
        if existing is None:
            raise
        return Submitted(existing, created=False)


def cancel_job(db: Database, job_id: str, actor: str, by_admin: bool) -> TransitionResult:
    reason = Reason.CancelledByAdmin if by_admin else Reason.CancelledByUser
    with db.write() as s:
        return set_state(
            s, job_id, JobState.CANCELLED, reason, Cause("api", actor),
            f"cancelled by {actor}",
        )
