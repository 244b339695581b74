"""Submitting and cancelling jobs: the write paths behind the API and CLI.

A submission is one transaction: the job row and its SUBMITTED event, then VALIDATING, then
QUEUED or REJECTED, all through set_state. Either all of it is stored or none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from broker.config import IsthmusConfig
from broker.domain import JobState, Reason
from broker.domain.clock import utcnow
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from broker.feasibility import feasibility
from broker.logs import get_logger
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import TransitionResult, append_event, set_state
from broker.store import batch, job_numbers, records
from broker.store.conflicts import on_conflict
from broker.store.db import Database
from broker.store.queries import find_by_idempotency_key, jobs_by_idempotency_keys
from broker.store.records import JobRecord

VALIDATOR = "system:validator"
KnownKeys = dict[tuple[str, str], JobRecord]
log = get_logger(__name__)


class IdempotencyConflict(Exception):
    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(
            f"Idempotency-Key '{key}' was already used for job {job_id} with a different body"
        )
        self.key = key
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class Submitted:
    job: JobRecord
    created: bool


def _replay_of(
    session: Session, spec: JobSpec, spec_hash: str, key: str, known: KnownKeys | None = None
) -> JobRecord | None:
    if known is None:
        existing = find_by_idempotency_key(session, spec.team, key)
    else:
        existing = known.get((spec.team, key))
    if existing is None:
        return None
    if existing.spec_hash != spec_hash:
        raise IdempotencyConflict(key, existing.id)
    return existing


@dataclass(frozen=True, slots=True)
class Submission:
    spec: JobSpec
    actor: str
    key: str | None = None
    number: int | None = None  # drawn beforehand (an array's tasks); else drawn at submit


def _array_of(spec: JobSpec) -> tuple[int | None, int | None]:
    """(array number, task index): an array whose id is a number (isbatch's arrays are) is
    found by ``NUMBER_TASK``; another id leaves the task reachable by its own ids only."""
    array = spec.scheduling.array if spec.scheduling is not None else None
    if array is None:
        return None, None
    parsed = job_numbers.parse_ref(array.id)
    return (parsed[0] if parsed is not None and parsed[1] is None else None), array.index


def known_keys(s: Session, subs: list[Submission]) -> KnownKeys:
    """The jobs already made under the keys of a batch, looked up in one statement."""
    return jobs_by_idempotency_keys(
        s, [(sub.spec.team, sub.key) for sub in subs if sub.key is not None]
    )


def _submit_in(
    s: Session, config: IsthmusConfig, sub: Submission, known: KnownKeys | None = None
) -> Submitted:
    """`known`: the batch's keys looked up beforehand (`known_keys`), else one look-up here."""
    spec, actor, key = sub.spec, sub.actor, sub.key
    spec_json = spec.canonical_json()
    spec_hash = spec.spec_hash()
    verdict = feasibility(config, spec)
    if key is not None:
        existing = _replay_of(s, spec, spec_hash, key, known)
        if existing is not None:
            return Submitted(existing, created=False)
    now = utcnow()
    number = sub.number if sub.number is not None else job_numbers.allocate(s)[0]
    array_number, array_index = _array_of(spec)
    job = JobRecord(
        id=new_job_id(), name=spec.name, team=spec.team, queue=spec.queue,
        priority=spec.priority, state=JobState.SUBMITTED.value,
        reason=Reason.Submitted.value, message="accepted by the API", attempt=0,
        last_seq=0, total_gpus=spec.gang.total_gpus, spec_json=spec_json,
        spec_hash=spec_hash, idempotency_key=key, submitted_by=actor, created_at=now,
        updated_at=now, number=number, array_number=array_number, array_index=array_index,
        unsaved_events=[],
    )
    append_event(
        s, job, None, JobState.SUBMITTED, Reason.Submitted, job.message,
        Cause("api", actor, key="submit"), now,
    )
    set_state(
        s, job.id, JobState.VALIDATING, Reason.Validating,
        Cause("validation", VALIDATOR, key="validate"), now=now, locked=job,
    )
    set_state(
        s, job.id, JobState.QUEUED if verdict.ok else JobState.REJECTED, verdict.reason,
        Cause("validation", VALIDATOR, key="validated"), verdict.message, now=now,
        locked=job,
    )
    records.insert_new_job(s, job)
    return Submitted(job, created=True)


def _after_race(db: Database, sub: Submission) -> Submitted:
    """A concurrent request with the same key won the race (PostgreSQL): answer as a replay."""
    if sub.key is not None:
        with db.read() as s:
            existing = _replay_of(s, sub.spec, sub.spec.spec_hash(), sub.key)
        if existing is not None:
            return Submitted(existing, created=False)
    raise RuntimeError("submission hit a unique constraint that no replay explains")


def submit_job(
    db: Database, config: IsthmusConfig, spec: JobSpec, actor: str, key: str | None = None
) -> Submitted:
    """Store a new job (or return the one this idempotency key already made)."""
    sub = Submission(spec, actor, key)
    try:
        with db.write() as s, batch.held_effects(s) as effects:
            done = _submit_in(s, config, sub)
    except IntegrityError:
        return _after_race(db, sub)
    effects.run_effects()  # the transition metrics, once the job is committed
    return done


def submit_many(
    db: Database, config: IsthmusConfig, subs: list[Submission]
) -> list[Submitted | Exception]:
    """Group commit: many submissions, one transaction and one fsync.

    Each submission runs in its own savepoint, so one that fails (an idempotency conflict, a
    lost race, or anything the database refuses, such as a string PostgreSQL cannot store) is
    rolled back alone and reported in its slot; the others commit together. One team's bad
    request must never fail another team's submission. The transition metrics count only
    what committed: a rolled-back savepoint's are dropped, the rest run after the commit.
    """
    out: list[Submitted | Exception] = []
    raced: list[int] = []
    with db.write() as s, batch.held_effects(s) as effects:
        subs = _numbered(s, subs)
        for i, sub in enumerate(subs):
            mark = effects.mark()
            try:
                with s.begin_nested():
                    out.append(_submit_in(s, config, sub))
            except IntegrityError:
                effects.cut(mark)
                raced.append(i)
                out.append(RuntimeError("lost a race"))
            except IdempotencyConflict as exc:
                effects.cut(mark)
                out.append(exc)
            except Exception as exc:  # reported to that caller only; the savepoint is undone
                effects.cut(mark)
                log.warning("submission %d of a batch of %d failed: %r", i + 1, len(subs), exc)
                out.append(exc)
    effects.run_effects()
    for i in raced:
        try:
            out[i] = _after_race(db, subs[i])
        except Exception as exc:  # reported to that caller only
            out[i] = exc
    return out


def _numbered(s: Session, subs: list[Submission]) -> list[Submission]:
    """The batch with a number drawn for each submission without one, in one statement per
    block instead of one per job; outside the savepoints, so a submission rolled back alone
    leaves a gap (never a number given twice), as an idempotent replay does."""
    wanting = [i for i, sub in enumerate(subs) if sub.number is None]
    out = list(subs)
    for start in range(0, len(wanting), job_numbers.MAX_BLOCK):
        chunk = wanting[start:start + job_numbers.MAX_BLOCK]
        for i, number in zip(chunk, job_numbers.allocate(s, len(chunk)), strict=True):
            out[i] = replace(subs[i], number=number)
    return out


@on_conflict  # a deadlock victim is cancelled again: its aborted transaction left nothing
def cancel_job(db: Database, job_id: str, actor: str, by_admin: bool) -> TransitionResult:
    reason = Reason.CancelledByAdmin if by_admin else Reason.CancelledByUser
    with db.write() as s, batch.held_effects(s) as effects:
        result = set_state(
            s, job_id, JobState.CANCELLED, reason, Cause("api", actor),
            f"cancelled by {actor}",
        )
    effects.run_effects()  # the transition's metrics, once it committed
    return result
