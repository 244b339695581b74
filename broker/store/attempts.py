"""Attempts: one row per try of a job, bound to its run snapshot. The row is also the outbox:
it is written with dispatch='pending' in the same transaction as QUEUED -> ADMITTED, before any
backend call, and turns 'created' once the backend object exists."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlmodel import Session

from broker.domain.facts import Phase
from broker.store import batch
from broker.store.in_lists import in_chunks, pair_params, pairs_in

# the tables of attempts, facts, cycles and explanations, named here for this module's callers
from broker.store.tables import ATTEMPTS as ATTEMPTS
from broker.store.tables import CYCLES as CYCLES
from broker.store.tables import EXPLANATIONS as EXPLANATIONS
from broker.store.tables import FACTS as FACTS

PENDING, CREATED, ABANDONED = "pending", "created", "abandoned"


@dataclass(slots=True)
class AttemptRecord:
    job_id: str
    number: int
    snapshot_json: str
    spec_hash: str
    backend_name: str
    created_at: datetime
    backend: str
    pool: str
    flavor: str
    gpus: int
    dispatch: str
    phase: str
    preempted: bool
    ended_at: datetime | None = None
    failure: str | None = None
    backend_id: str | None = None
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    last_seen_at: datetime | None = None
    missing_since: datetime | None = None
    progress_token_sha256: str | None = None
    last_step: int | None = None
    last_progress_at: datetime | None = None
    rendered: str | None = None
    resolved_json: str | None = None  # reproducibility.ResolvedRun, once the ranks started
    checkpoint_path: str | None = None
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    retry_decision: str | None = None  # broker.control.requeue: RETRY, STOP or NONE
    preempt_signalled_at: datetime | None = None  # broker.control.preempt: intent to stop it


_FIELDS = list(AttemptRecord.__dataclass_fields__)
_COLS = [ATTEMPTS.c[f] for f in _FIELDS]


def _rec(row: Any) -> AttemptRecord:
    return AttemptRecord(*row)


_INSERT_ATTEMPT = sa.insert(ATTEMPTS)


def insert_attempt(session: Session, rec: AttemptRecord) -> None:
    batch.write(session, _INSERT_ATTEMPT, {f: getattr(rec, f) for f in _FIELDS})


# The statements of the control loop's look-ups are built once, with bind parameters (an IN
# list as one expanding parameter): SQLAlchemy then reuses their compiled form, where a
# statement built per call pays its construction and cache key every time (a tenth of a
# reconcile pass went there).
_GET_ATTEMPT = sa.select(*_COLS).where(ATTEMPTS.c.job_id == sa.bindparam("job_id"),
                                       ATTEMPTS.c.number == sa.bindparam("number"))
_ATTEMPTS_OF = (sa.select(*_COLS).where(ATTEMPTS.c.job_id == sa.bindparam("job_id"))
                .order_by(ATTEMPTS.c.number))
_PENDING = sa.and_(ATTEMPTS.c.dispatch == PENDING, ATTEMPTS.c.ended_at.is_(None))
_PENDING_BACKENDS = sa.select(ATTEMPTS.c.backend).where(_PENDING).distinct()
_PENDING_OF = (sa.select(*_COLS).where(_PENDING, ATTEMPTS.c.backend == sa.bindparam("backend"))
               .order_by(ATTEMPTS.c.created_at).limit(sa.bindparam("limit")))
_BY_KEYS = sa.select(*_COLS).where(pairs_in(ATTEMPTS.c.job_id, ATTEMPTS.c.number, "keys"))


def get_attempt(session: Session, job_id: str, number: int) -> AttemptRecord | None:
    row = session.connection().execute(_GET_ATTEMPT, {"job_id": job_id, "number": number}).first()
    return None if row is None else _rec(row)


def attempts_of(session: Session, job_id: str) -> list[AttemptRecord]:
    rows = session.connection().execute(_ATTEMPTS_OF, {"job_id": job_id})
    return [_rec(r) for r in rows]


def to_dispatch(session: Session, limit: int = 500) -> list[AttemptRecord]:
    """Pending intents, oldest first, at most `limit` per backend: the oldest intents of one
    backend (say, an unreachable one) never crowd the other backends' intents out of a pass."""
    conn = session.connection()
    backends = [r[0] for r in conn.execute(_PENDING_BACKENDS)]
    out: list[AttemptRecord] = []
    for backend in sorted(backends):
        rows = conn.execute(_PENDING_OF, {"backend": backend, "limit": limit})
        out.extend(_rec(r) for r in rows)
    out.sort(key=lambda a: a.created_at)
    return out


def live(session: Session, backend: str | None = None) -> list[AttemptRecord]:
    """Attempts whose backend object exists or may exist (not ended)."""
    stmt = sa.select(*_COLS).where(ATTEMPTS.c.ended_at.is_(None))
    if backend is not None:
        stmt = stmt.where(ATTEMPTS.c.backend == backend)
    return [_rec(r) for r in session.connection().execute(stmt)]


@dataclass(frozen=True, slots=True)
class Unseen:
    """A live attempt whose GPUs the backend's inventory may not show yet: not dispatched,
    never observed, or observed before every rank runs (a Kubernetes Job whose pods are not
    all created or bound shows only some of its nodes busy; the rest would look free and a
    second gang would be placed on them)."""

    job_id: str
    number: int
    pool: str
    gpus: int


_UNSEEN = sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.number, ATTEMPTS.c.pool, ATTEMPTS.c.gpus).where(
    ATTEMPTS.c.ended_at.is_(None),
    sa.or_(ATTEMPTS.c.dispatch != CREATED, ATTEMPTS.c.last_seen_at.is_(None),
          ATTEMPTS.c.phase != Phase.RUNNING.value),
)


def unseen(session: Session) -> list[Unseen]:
    """Live attempts the backends' inventories cannot account for yet: the narrow columns
    only (the admission cycle reads them every cycle; their snapshots through `snapshots`)."""
    return [Unseen(*r) for r in session.connection().execute(_UNSEEN)]


_SNAPSHOTS = sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.number, ATTEMPTS.c.snapshot_json).where(
    pairs_in(ATTEMPTS.c.job_id, ATTEMPTS.c.number, "keys"))


def snapshots(session: Session, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The run snapshots (JSON) of the attempts `keys` (job id, number)."""
    out: dict[tuple[str, int], str] = {}
    conn = session.connection()
    for chunk in in_chunks(keys):
        rows = conn.execute(_SNAPSHOTS, pair_params("keys", chunk))
        out.update({(r[0], r[1]): r[2] for r in rows})
    return out


class Brief(NamedTuple):
    """A dispatched live attempt and its job's lifecycle fields: what a reconcile pass needs
    to see that nothing changed (the full rows are read only for those that did). A tuple:
    made straight from the row."""

    job_id: str
    number: int
    backend_name: str
    phase: str
    job_state: str | None  # None: the job row is gone
    job_reason: str | None
    job_attempt: int | None


def brief_statement(dialect: str) -> Any:
    """The statement of `dispatched_brief` (parameters: backend), for `dialect`. Revision 0012
    covers it: the live attempts' index in id order, the jobs' lifecycle index. SQLite would
    search the jobs' primary key and read each job's row instead (it prefers a unique index),
    so it is told which index to use."""
    from broker.store.records import JOBS

    if dialect == "sqlite":
        return sa.text(
            "SELECT a.job_id, a.number, a.backend_name, a.phase, j.state, j.reason, j.attempt "
            "FROM attempts AS a LEFT OUTER JOIN jobs AS j INDEXED BY ix_jobs_lifecycle "
            "ON j.id = a.job_id WHERE a.ended_at IS NULL AND a.backend = :backend "
            "AND a.dispatch = :created ORDER BY a.id"
        ).bindparams(created=CREATED)
    return (
        sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.number, ATTEMPTS.c.backend_name,
                  ATTEMPTS.c.phase, JOBS.c.state, JOBS.c.reason, JOBS.c.attempt)
        .select_from(ATTEMPTS.outerjoin(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
        .where(ATTEMPTS.c.ended_at.is_(None), ATTEMPTS.c.backend == sa.bindparam("backend"),
               ATTEMPTS.c.dispatch == CREATED)
        .order_by(ATTEMPTS.c.id)
    )


_BRIEF: dict[str, Any] = {}


def dispatched_brief(session: Session, backend: str) -> list[Brief]:
    """The live attempts of `backend` whose object was created, with their jobs' state,
    reason and current attempt: narrow columns, one statement. On SQLite the driver's rows
    are taken as they come (fetchall of plain tuples: SQLAlchemy's row objects cost more
    than the query itself at tens of thousands of rows)."""
    conn = session.connection()
    dialect = conn.dialect.name
    stmt: Any = _BRIEF.get(dialect)
    if stmt is None:
        stmt = brief_statement(dialect)
        if dialect == "sqlite":  # its text, with the driver's placeholders
            stmt = str(stmt.compile(dialect=conn.dialect))
        _BRIEF[dialect] = stmt
    if dialect == "sqlite":
        driver = conn.connection.driver_connection
        assert driver is not None
        return list(map(Brief._make, driver.execute(stmt, (backend, CREATED)).fetchall()))
    return list(map(Brief._make, conn.execute(stmt, {"backend": backend}).all()))


class Holding(NamedTuple):
    """A live attempt that is its job's current one while the job holds GPUs, with the
    times that move while it runs (preemption's views: the rest of a view never changes)."""

    job_id: str
    number: int
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    checkpoint_at: datetime | None


@cache
def _holding_statement() -> Any:
    """Built once, on first use (the jobs' table is imported late: records imports this)."""
    from broker.domain.states import HOLDING
    from broker.store.records import JOBS

    return (
        sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.number, ATTEMPTS.c.created_at,
                  ATTEMPTS.c.dispatched_at, ATTEMPTS.c.started_at, ATTEMPTS.c.checkpoint_at)
        .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
        .where(ATTEMPTS.c.ended_at.is_(None), JOBS.c.attempt == ATTEMPTS.c.number,
               JOBS.c.state.in_(sorted(s.value for s in HOLDING)))
    )


def holding(session: Session) -> list[Holding]:
    """Every live attempt whose job holds GPUs and is on that attempt: narrow columns, one
    statement (no snapshot or spec text)."""
    return list(map(Holding._make, session.connection().execute(_holding_statement())))


_UNDECIDED = (
    sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
    .where(ATTEMPTS.c.retry_decision.is_(None), ATTEMPTS.c.ended_at.is_not(None),
           # `preempted` as the index has it: SQLAlchemy writes `preempted = 1` on SQLite,
           # which SQLite does not see implies the index's `preempted`, and scanned every
           # attempt instead
           sa.or_(ATTEMPTS.c.failure.is_not(None),
                  sa.literal_column("attempts.preempted")))
    .order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.number)
)
"""The predicate of the partial index ix_attempts_undecided (revision 0014), so the look-up is
one range of that index."""


def undecided(session: Session, limit: int = 500) -> list[tuple[str, int]]:
    """Attempts ended in a failure or a preemption with no retry decision recorded (only an
    older version leaves them: broker.control.requeue.repair_undecided), at most `limit`."""
    return [(r[0], r[1]) for r in session.connection().execute(_UNDECIDED.limit(limit))]


def by_keys(session: Session, keys: list[tuple[str, int]]) -> list[AttemptRecord]:
    """The attempts `keys` (job id, number), in that order (missing ones left out)."""
    found: dict[tuple[str, int], AttemptRecord] = {}
    conn = session.connection()
    for chunk in in_chunks(keys):
        rows = conn.execute(_BY_KEYS, pair_params("keys", chunk))
        found.update({(r.job_id, r.number): r for r in map(_rec, rows)})
    return [found[k] for k in keys if k in found]


_UPDATES: dict[tuple[str, ...], Any] = {}


def _update_of(names: tuple[str, ...]) -> Any:
    """The UPDATE of these fields, built once per set of fields (the reconciler writes a few
    sets over and over), with bind parameters, so its compiled form is reused."""
    stmt = _UPDATES.get(names)
    if stmt is None:
        stmt = _UPDATES[names] = (
            sa.update(ATTEMPTS)
            .where(ATTEMPTS.c.job_id == sa.bindparam("k_job"),
                   ATTEMPTS.c.number == sa.bindparam("k_number"))
            .values({n: sa.bindparam(f"v_{n}") for n in names})
        )
    return stmt


def update(session: Session, job_id: str, number: int, **values: Any) -> None:
    session.connection().execute(*_update(job_id, number, values))


def update_queued(session: Session, job_id: str, number: int, **values: Any) -> None:
    """`update`, queued inside a batch of deferred writes (broker.store.batch; at once
    outside one): for a caller that does not read the row back before the batch is sent."""
    batch.write(session, *_update(job_id, number, values))


def _update(job_id: str, number: int, values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    bad = set(values) - set(_FIELDS)
    if bad:
        raise ValueError(f"unknown attempt field(s) {sorted(bad)}")
    names = tuple(sorted(values))
    params = {f"v_{n}": values[n] for n in names}
    return _update_of(names), {"k_job": job_id, "k_number": number, **params}


_SET_RESOLVED = (
    sa.update(ATTEMPTS)
    .where(ATTEMPTS.c.job_id == sa.bindparam("k_job"),
           ATTEMPTS.c.number == sa.bindparam("k_number"), ATTEMPTS.c.resolved_json.is_(None))
    .values(resolved_json=sa.bindparam("v_resolved"))
)
"""Built once (its compiled form reused): the reconciler runs it for every attempt that
starts."""


def set_resolved_once(session: Session, job_id: str, number: int, resolved_json: str) -> None:
    """Store what the attempt ran with, unless it was stored before (never rewritten); queued
    inside a batch of deferred writes (broker.store.batch: its WHERE keeps it once)."""
    batch.write(session, _SET_RESOLVED,
                {"k_job": job_id, "k_number": number, "v_resolved": resolved_json})


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint an attempt reported: where it is, the step it holds, when it was reported."""

    attempt: int
    path: str
    step: int | None
    at: datetime


def _last_checkpoint_statement(before: bool) -> Any:
    stmt = sa.select(ATTEMPTS.c.number, ATTEMPTS.c.checkpoint_path, ATTEMPTS.c.checkpoint_step,
                     ATTEMPTS.c.checkpoint_at).where(
        ATTEMPTS.c.job_id == sa.bindparam("job_id"), ATTEMPTS.c.checkpoint_path.is_not(None)
    )
    if before:
        stmt = stmt.where(ATTEMPTS.c.number < sa.bindparam("before"))
    return stmt.order_by(ATTEMPTS.c.checkpoint_at.desc(), ATTEMPTS.c.number.desc()).limit(1)


_LAST_CHECKPOINT = {b: _last_checkpoint_statement(b) for b in (False, True)}
"""Built once (every GET of a job reads it): building and keying it cost more than running it."""


def last_checkpoint(session: Session, job_id: str, before: int | None = None) -> Checkpoint | None:
    """The latest checkpoint any attempt of the job reported (of attempts numbered below
    `before` when given): the one a next attempt resumes from."""
    row = session.connection().execute(_LAST_CHECKPOINT[before is not None],
                                       {"job_id": job_id, "before": before}).first()
    return None if row is None else Checkpoint(row[0], row[1], row[2], row[3])


_BY_TOKEN_DIGEST = sa.select(*_COLS).where(
    ATTEMPTS.c.job_id == sa.bindparam("job_id"),
    ATTEMPTS.c.progress_token_sha256 == sa.bindparam("digest"))
"""Built once (a job's first progress report, and each checkpoint, reads it)."""


def by_token_digest(session: Session, job_id: str, digest: str) -> AttemptRecord | None:
    row = session.connection().execute(_BY_TOKEN_DIGEST,
                                       {"job_id": job_id, "digest": digest}).first()
    return None if row is None else _rec(row)


@cache
def _step_statement() -> Any:
    from broker.store.tables import JOBS

    useful = sa.exists().where(JOBS.c.id == ATTEMPTS.c.job_id,
                               JOBS.c.first_useful_work_at.is_not(None))
    return (
        sa.update(ATTEMPTS)
        .where(ATTEMPTS.c.job_id == sa.bindparam("k_job"),
               ATTEMPTS.c.progress_token_sha256 == sa.bindparam("k_digest"),
               ATTEMPTS.c.ended_at.is_(None), useful)
        .values(last_step=sa.bindparam("v_step"), last_progress_at=sa.bindparam("v_at"))
        .returning(ATTEMPTS.c.number)
    )


def report_step(session: Session, job_id: str, digest: str, step: int,
                at: datetime) -> int | None:
    """A progress report of a step alone, in one statement: the number of the running attempt
    whose token has `digest`, once its step is set, or None (nothing written: no such attempt,
    it ended, or the job has no first useful work yet, which the caller writes under the job's
    lock). The attempt row is the only row this locks, and its transaction takes no other
    lock after it, so it cannot deadlock with a pass that holds the job row and waits for the
    attempt's."""
    row = session.connection().execute(
        _step_statement(), {"k_job": job_id, "k_digest": digest, "v_step": step, "v_at": at}
    ).first()
    return None if row is None else int(row[0])


# RETURNING the attempt with each id: SQLite returns the rows of a many-row insert in no set
# order, and SQLAlchemy sends one statement per row when asked to sort them
_INSERT_FACTS = sa.insert(FACTS).returning(FACTS.c.job_id, FACTS.c.attempt, FACTS.c.id)


class NewFact(NamedTuple):
    """A fact to store (`insert_facts`)."""

    backend: str
    backend_name: str
    job_id: str | None
    attempt: int | None
    phase: str
    reason: str
    observed_at: datetime
    payload_json: str


def insert_facts(session: Session, facts: list[NewFact]) -> list[int]:
    """Store `facts`, of distinct attempts, in one statement (per 500); their ids, in the
    order given."""
    keys = [(f.job_id, f.attempt) for f in facts]
    if len(set(keys)) < len(keys):
        raise ValueError("insert_facts takes one fact per attempt")
    ids: dict[tuple[str | None, int | None], int] = {}
    conn = session.connection()
    for chunk in in_chunks(facts):
        params = [f._asdict() for f in chunk]
        # on PostgreSQL one text for any number of facts (the rows as one JSON parameter)
        rows = batch.insert_returning(conn, _INSERT_FACTS, params)
        if rows is None:
            rows = conn.execute(_INSERT_FACTS, params)
        ids.update(((r[0], r[1]), int(r[2])) for r in rows)
    return [ids[k] for k in keys]


def insert_cycle(
    session: Session, at: datetime, epoch: int, digest: str, record_json: str
) -> int:
    """Store a cycle's record; its id (the decision log refers to it)."""
    result = session.connection().execute(
        sa.insert(CYCLES).values(
            at=at, leader_epoch=epoch, inputs_digest=digest, record_json=record_json
        )
    )
    key = result.inserted_primary_key
    return int(key[0]) if key else 0


def fold_idle_cycle(session: Session, cycle_id: int, epoch: int, at: datetime) -> bool:
    """Count one more idle cycle on the stored cycle `cycle_id` of this leader's `epoch`;
    False when that row is gone (pruned) or not this epoch's."""
    result = session.connection().execute(
        sa.update(CYCLES).where(CYCLES.c.id == cycle_id, CYCLES.c.leader_epoch == epoch)
        .values(repeats=CYCLES.c.repeats + 1, last_at=at)
    )
    return bool(result.rowcount)


# One text statement for both databases (SQLite >= 3.24 and PostgreSQL): an upsert needs no
# look at the rowcount, so it can be batched (store/batch.py).
assert EXPLANATIONS.name == "explanations"
_UPSERT_EXPLANATION = sa.text(
    "INSERT INTO explanations (job_id, at, payload_json) VALUES (:jid, :at, :payload) "
    "ON CONFLICT (job_id) DO UPDATE SET at = excluded.at, payload_json = excluded.payload_json"
).bindparams(sa.bindparam("at", type_=EXPLANATIONS.c.at.type))
batch.upsert_rows(_UPSERT_EXPLANATION, EXPLANATIONS, keys=("jid",), last_wins=True)


def save_explanation(session: Session, job_id: str, at: datetime, payload_json: str) -> None:
    batch.write(session, _UPSERT_EXPLANATION, {"jid": job_id, "at": at, "payload": payload_json})


def get_explanation(session: Session, job_id: str) -> tuple[datetime, str] | None:
    row = session.connection().execute(
        sa.select(EXPLANATIONS.c.at, EXPLANATIONS.c.payload_json).where(
            EXPLANATIONS.c.job_id == job_id
        )
    ).first()
    return None if row is None else (row[0], row[1])
