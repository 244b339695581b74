"""Plain records and Core statements for the hot write path.

The ORM (SQLModel) defines the tables; the transition path reads and writes them with
SQLAlchemy Core, which costs a fraction of ORM unit-of-work bookkeeping per statement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlmodel import Session

from broker.logs import get_logger
from broker.store import batch, cause_lookups
from broker.store.in_lists import one_of

# the tables of jobs and events, named here for this module's callers
from broker.store.tables import ATTEMPTS
from broker.store.tables import EVENTS as EVENTS
from broker.store.tables import JOBS as JOBS

log = get_logger(__name__)


@dataclass(slots=True)
class JobRecord:
    id: str
    name: str
    team: str
    queue: str
    priority: str
    state: str
    reason: str
    message: str
    attempt: int
    last_seq: int
    total_gpus: int
    spec_json: str
    spec_hash: str
    idempotency_key: str | None
    submitted_by: str
    created_at: datetime
    updated_at: datetime
    first_useful_work_at: datetime | None = None
    not_before: datetime | None = None  # end of a retry backoff
    exclude_json: str = "{}"  # pools and nodes the next attempt avoids
    number: int | None = None  # the numeric id (None only for rows made before it existed)
    array_number: int | None = None  # an array task's array id: its first task's number
    array_index: int | None = None
    # Set while a job is being created in the current transaction and not yet inserted:
    # its events wait here and are written with the row in one go. Nobody else can see the
    # job, so no lock or idempotency look-up is needed for it either.
    unsaved_events: list[EventRecord] | None = field(default=None, compare=False, repr=False)

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _JOB_FIELDS}


@dataclass(frozen=True, slots=True)
class EventRecord:
    job_id: str
    seq: int
    at: datetime
    from_state: str | None
    to_state: str
    reason: str
    message: str
    cause_kind: str
    cause_key: str | None
    actor: str
    attempt: int
    facts_ref: str | None = None
    details_json: str | None = None


_JOB_FIELDS = [f.name for f in fields(JobRecord) if f.name != "unsaved_events"]
_EVENT_FIELDS = [f.name for f in fields(EventRecord)]
_JOB_COLS = [JOBS.c[name] for name in _JOB_FIELDS]
_EVENT_COLS = [EVENTS.c[name] for name in _EVENT_FIELDS]


def job_from_row(row: Any) -> JobRecord:
    return JobRecord(*row)


def event_from_row(row: Any) -> EventRecord:
    return EventRecord(*row)


def select_jobs() -> sa.Select[Any]:
    return sa.select(*_JOB_COLS)


def select_events() -> sa.Select[Any]:
    return sa.select(*_EVENT_COLS)


# Statements are built once; SQLAlchemy then reuses their compiled form.
_INSERT_JOB = sa.insert(JOBS)
_INSERT_EVENT = sa.insert(EVENTS)
_LOCK_JOB = select_jobs().where(JOBS.c.id == sa.bindparam("job_id")).with_for_update()
_STATE_FIELDS = ("state", "reason", "message", "attempt", "last_seq", "updated_at")
_SAVE_STATE = (
    sa.update(JOBS)
    .where(JOBS.c.id == sa.bindparam("job_id"))
    .values({name: sa.bindparam(f"new_{name}") for name in _STATE_FIELDS})
)
_LOCK_JOBS = (select_jobs().where(one_of(JOBS.c.id, "ids"))
              .order_by(JOBS.c.id).with_for_update())
_LOCK_SEQS = (sa.select(JOBS.c.id, JOBS.c.last_seq).where(one_of(JOBS.c.id, "ids"))
              .order_by(JOBS.c.id).with_for_update())  # lock_unmoved: the rows were read
_EVENT_FOR_CAUSE = select_events().where(
    EVENTS.c.job_id == sa.bindparam("job_id"), EVENTS.c.cause_key == sa.bindparam("key")
)


def insert_new_job(session: Session, job: JobRecord) -> None:
    """Insert a job built in memory together with the events set_state gave it."""
    session.info[STATE_WRITTEN] = True
    events = [{name: getattr(ev, name) for name in _EVENT_FIELDS}
              for ev in job.unsaved_events or ()]
    job.unsaved_events = None
    if batch.active(session):  # one executemany per statement for the whole batch
        batch.write(session, _INSERT_JOB, job.values())
        for params in events:
            batch.write(session, _INSERT_EVENT, params)
        return
    conn = session.connection()
    conn.execute(_INSERT_JOB, job.values())
    if events:
        conn.execute(_INSERT_EVENT, events)


def lock_job(session: Session, job_id: str) -> JobRecord | None:
    row = session.connection().execute(_LOCK_JOB, {"job_id": job_id}).first()
    return None if row is None else job_from_row(row)


def lock_jobs(session: Session, job_ids: list[str]) -> dict[str, JobRecord]:
    """Lock several jobs in one statement (ordered by id, as every multi-row lock here is, so
    that two lockers cannot deadlock); the ones that exist, by id."""
    rows = session.connection().execute(_LOCK_JOBS, {"ids": sorted(job_ids)})
    return {job.id: job for job in map(job_from_row, rows)}


class JobsMoved(Exception):
    """Jobs read without a lock changed before `lock_unmoved` locked them: what was decided
    from that read is void (the caller's transaction rolls back and decides again, its jobs
    locked first)."""

    def __init__(self, job_ids: list[str]) -> None:
        super().__init__(f"{len(job_ids)} job(s) changed since they were read: "
                         f"{', '.join(job_ids[:5])}")
        self.job_ids = job_ids


def lock_unmoved(session: Session, seen: dict[str, int]) -> None:
    """Lock the jobs `seen` (id -> the `last_seq` read earlier in this transaction, without a
    lock) as `lock_jobs` does, reading only their `last_seq`; JobsMoved if one of them changed
    since, or is gone. A job's `last_seq` moves with every change of its state (set_state
    writes both, with its event); the job row's only other writes are the retry terms
    (`set_retry_terms`, written with the transition to RETRYING or QUEUED that uses them) and
    `first_useful_work_at` (a progress report's; nothing that decides from a job reads it)."""
    rows = session.connection().execute(_LOCK_SEQS, {"ids": sorted(seen)})
    now = {job_id: seq for job_id, seq in rows}
    moved = sorted(job_id for job_id, seq in seen.items() if now.get(job_id) != seq)
    if moved:
        raise JobsMoved(moved)


T = TypeVar("T")


def with_late_locks(write: Callable[[bool], T]) -> T:
    """`write(lock_first)`, a chunk's transaction: first with lock_first=False (its jobs read
    without a lock, `lock_unmoved` before its writes are sent); if one moved meanwhile
    (JobsMoved, the transaction rolled back), again with lock_first=True, its jobs locked
    before it decides (nothing can move them then)."""
    try:
        return write(False)
    except JobsMoved as moved:
        log.debug("%s; the chunk is written again, its jobs locked first", moved)
        return write(True)


def save_state(session: Session, job: JobRecord) -> None:
    if job.unsaved_events is not None:
        return  # written whole by insert_new_job
    params = {f"new_{name}": getattr(job, name) for name in _STATE_FIELDS}
    params["job_id"] = job.id
    batch.write(session, _SAVE_STATE, params)


STATE_WRITTEN = "isthmus_state_written"
"""Set in `session.info` by a transaction that appended a job event (a state change): the
crash-safety tests kill the process after such a commit (broker.control.faults)."""


def insert_event(session: Session, job: JobRecord, event: EventRecord) -> None:
    session.info[STATE_WRITTEN] = True
    if event.cause_key is not None:
        cause_lookups.learn(session, event.job_id, event.cause_key)
    if job.unsaved_events is not None:
        job.unsaved_events.append(event)
        return
    batch.write(session, _INSERT_EVENT, {name: getattr(event, name) for name in _EVENT_FIELDS})


def event_for_cause(session: Session, job_id: str, key: str) -> EventRecord | None:
    if cause_lookups.known_new(session, job_id, key):
        return None
    row = session.connection().execute(_EVENT_FOR_CAUSE, {"job_id": job_id, "key": key}).first()
    return None if row is None else event_from_row(row)


_SET_RETRY_TERMS = (sa.update(JOBS).where(JOBS.c.id == sa.bindparam("job_id"))
                    .values(not_before=sa.bindparam("v_not_before"),
                            exclude_json=sa.bindparam("v_exclude")))


def set_retry_terms(
    session: Session, job_id: str, not_before: datetime | None, exclude_json: str
) -> None:
    """Queued inside a batch of deferred writes (at once outside one): a chunk that decides a
    retry before it locks its jobs (`lock_unmoved`) writes the job's row only after."""
    batch.write(session, _SET_RETRY_TERMS, {
        "job_id": job_id, "v_not_before": not_before, "v_exclude": exclude_json})


_SET_FIRST_USEFUL_WORK = (
    sa.update(JOBS)
    .where(JOBS.c.id == sa.bindparam("job_id"), JOBS.c.first_useful_work_at.is_(None))
    .values(first_useful_work_at=sa.bindparam("at"))
)


def set_first_useful_work(session: Session, job_id: str, at: datetime) -> bool:
    """Set once: True only for the call that set it."""
    result = session.connection().execute(_SET_FIRST_USEFUL_WORK, {"job_id": job_id, "at": at})
    return bool(result.rowcount)


_START_USEFUL_WORK = _SET_FIRST_USEFUL_WORK.where(
    sa.exists().where(ATTEMPTS.c.job_id == JOBS.c.id,
                      ATTEMPTS.c.progress_token_sha256 == sa.bindparam("digest"),
                      ATTEMPTS.c.ended_at.is_(None))
).returning(JOBS.c.team, JOBS.c.created_at)


def start_useful_work(session: Session, job_id: str, digest: str,
                      at: datetime) -> tuple[str, datetime] | None:
    """A job's first progress report, in one statement: its first useful work set to `at` when
    none is and an attempt with the token's `digest` has not ended; the job's team and
    creation time, or None (nothing written). The job row is locked before any attempt row
    (the order of set_state and the passes); its attempt is only read, so the caller writes
    the attempt after it, and a pass may have ended that attempt before this statement got
    the job's lock (PostgreSQL checks the attempt as of the statement's start): the write of
    the attempt, which requires it running, then finds none."""
    row = session.connection().execute(
        _START_USEFUL_WORK, {"job_id": job_id, "digest": digest, "at": at}).first()
    return None if row is None else (row[0], row[1])
