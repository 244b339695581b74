"""Read-side queries for the admin views and reports (broker/views): pools, quotas, usage.

Aggregates are computed by the database (GROUP BY), so a report over a million ledger rows
moves a few rows to Python, not a million. Usage over whole UTC days is read from the daily
sums of the ledger (ledger_daily, revision 0011, written at every commit that booked entries:
broker/store/daily_sums.py);
the entries of the partial days at a window's edges are read from the ledger itself.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.attempts import ATTEMPTS
from broker.store.records import JOBS
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

GroupBy = Literal["team", "pool", "flavor", "user"]
GROUPS: tuple[GroupBy, ...] = ("team", "pool", "flavor", "user")

PLACED_PHASES = ("STARTING", "RUNNING")
"""Phases in which an attempt's ranks hold GPUs on the backend's nodes."""


def live_gpus_by_pool(session: Session) -> dict[str, tuple[int, int]]:
    """(placed, not yet placed) GPUs of Isthmus attempts per pool: placed ones hold nodes
    (STARTING or RUNNING); the others are admitted and wait in or for the backend."""
    placed = sa.case((ATTEMPTS.c.phase.in_(PLACED_PHASES), ATTEMPTS.c.gpus), else_=0)
    waiting = sa.case((ATTEMPTS.c.phase.in_(PLACED_PHASES), 0), else_=ATTEMPTS.c.gpus)
    rows = session.connection().execute(
        sa.select(ATTEMPTS.c.pool, sa.func.sum(placed), sa.func.sum(waiting))
        .where(ATTEMPTS.c.ended_at.is_(None))
        .group_by(ATTEMPTS.c.pool)
    )
    return {pool: (int(p or 0), int(w or 0)) for pool, p, w in rows}


@dataclass(frozen=True, slots=True)
class QueuedJob:
    id: str
    team: str
    total_gpus: int
    spec_hash: str
    spec_json: str


def queued_jobs(session: Session, team: str | None = None) -> list[QueuedJob]:
    """Jobs waiting for admission (QUEUED), optionally of one team."""
    stmt = sa.select(
        JOBS.c.id, JOBS.c.team, JOBS.c.total_gpus, JOBS.c.spec_hash, JOBS.c.spec_json
    ).where(JOBS.c.state == "QUEUED")
    if team is not None:
        stmt = stmt.where(JOBS.c.team == team)
    return [QueuedJob(*r) for r in session.connection().execute(stmt)]


@dataclass(frozen=True, slots=True)
class HoursRow:
    """Summed GPU-hours and cost of one group and ledger kind."""

    key: str
    kind: str
    gpu_hours: float
    cost: float
    unpriced_gpu_hours: float
    """Hours of entries written before costs were numeric (revision 0007): no cost."""


HOURS_FILTER = ENTRIES.c.kind.not_in(["reserve", "release"])
"""Usage and waste entries: the predicate of PostgreSQL's partial index ix_ledger_hours."""
UNLABELLED = sa.and_(HOURS_FILTER, sa.or_(ENTRIES.c.pool.is_(None),
                                          ENTRIES.c.submitted_by.is_(None)))
"""Entries booked before revision 0010 (no pool, no user): the predicate of the partial index
ix_ledger_unlabelled, so that reports find them without a scan."""


def _sums(key: sa.ColumnElement[str], start: datetime | None, end: datetime | None,
          team: str | None) -> sa.Select[Any]:
    unpriced = sa.case((ENTRIES.c.cost.is_(None), ENTRIES.c.gpu_hours), else_=0.0)
    stmt = sa.select(
        key.label("key"), ENTRIES.c.kind, sa.func.sum(ENTRIES.c.gpu_hours),
        sa.func.sum(sa.func.coalesce(ENTRIES.c.cost, 0.0)), sa.func.sum(unpriced),
    ).group_by(key, ENTRIES.c.kind)
    if start is not None:
        stmt = stmt.where(ENTRIES.c.at >= start)
    if end is not None:
        stmt = stmt.where(ENTRIES.c.at < end)
    if team is not None:
        stmt = stmt.where(ENTRIES.c.team == team)
    return stmt


def _statements(by: GroupBy, start: datetime | None, end: datetime | None,
                team: str | None) -> list[sa.Select[Any]]:
    """Team and flavor: one statement. Pool and user are on every entry booked since
    revision 0010: one statement for those, one that looks up the older entries' (their
    attempt's pool, their job's submitter) through the partial index."""
    if by in ("team", "flavor"):
        column = ENTRIES.c.team if by == "team" else ENTRIES.c.flavor
        return [_sums(column, start, end, team).where(HOURS_FILTER)]
    own = ENTRIES.c.pool if by == "pool" else ENTRIES.c.submitted_by
    if by == "pool":
        found = sa.select(ATTEMPTS.c.pool).where(
            ATTEMPTS.c.job_id == ENTRIES.c.job_id, ATTEMPTS.c.number == ENTRIES.c.attempt)
    else:
        found = sa.select(JOBS.c.submitted_by).where(JOBS.c.id == ENTRIES.c.job_id)
    # one index look-up per older entry (they are few once revision 0010 has run a while)
    looked_up = sa.func.coalesce(found.scalar_subquery(), "")
    return [
        _sums(own, start, end, team).where(HOURS_FILTER, own.is_not(None)),
        _sums(looked_up, start, end, team).where(UNLABELLED, own.is_(None)),
    ]


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def split_days(start: datetime | None, end: datetime | None
               ) -> tuple[tuple[date | None, date | None] | None,
                          list[tuple[datetime | None, datetime | None]]]:
    """[start, end) as the whole UTC days [first, last) it covers (None for an open end; no
    days at all when it covers none) and the windows of partial days at its edges, which
    are read from the entries themselves."""
    first = last = None
    edges: list[tuple[datetime | None, datetime | None]] = []
    if start is not None:
        first = start.astimezone(UTC).date()
        if _midnight(first) != start:  # start's own day is partial
            if first == date.max:
                return None, [(start, end)]
            first += timedelta(days=1)
            edges.append((start, _midnight(first)))
    if end is not None:
        last = end.astimezone(UTC).date()  # end's own day is partial, if it has begun
        if _midnight(last) != end:
            edges.append((_midnight(last), end))
    if first is not None and last is not None and first >= last:
        return None, [(start, end)]
    return (first, last), edges


def _daily(by: GroupBy, first: date | None, last: date | None,
           team: str | None) -> sa.Select[Any]:
    """Sums per group and kind of the whole days [first, last) from ledger_daily."""
    stmt = sa.select(
        DAILY.c.value, DAILY.c.kind, sa.func.sum(DAILY.c.gpu_hours),
        sa.func.sum(DAILY.c.cost), sa.func.sum(DAILY.c.unpriced_gpu_hours),
    ).where(DAILY.c.dim == by).group_by(DAILY.c.value, DAILY.c.kind)
    if first is not None:
        stmt = stmt.where(DAILY.c.day >= first)
    if last is not None:
        stmt = stmt.where(DAILY.c.day < last)
    if team is not None:
        stmt = stmt.where(DAILY.c.team == team)
    return stmt


def _no_jit(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        # PostgreSQL's JIT compiles these aggregates for longer than they run (1.4 s for a
        # 20 ms look-up of older entries, measured by bench/usage_report.py): off for this
        # read transaction only
        conn.exec_driver_sql("SET LOCAL jit = off")


def _row(k: Any, kind: Any, hours: Any, cost: Any, bare: Any) -> HoursRow:
    return HoursRow(str(k), str(kind), float(hours or 0), float(cost or 0), float(bare or 0))


def hours_series(session: Session, by: GroupBy, bounds: list[datetime],
                 team: str | None = None) -> list[list[HoursRow]]:
    """`hours_by` of each window [bounds[i], bounds[i + 1]) (bounds ascending), in one
    statement (two for pool and user): from the daily sums when every bound is a UTC
    midnight, else from the entries, each entry's window picked by the database."""
    conn = session.connection()
    _no_jit(conn)
    out: list[list[HoursRow]] = [[] for _ in bounds[1:]]
    days = [b.astimezone(UTC).date() for b in bounds]
    if all(_midnight(d) == b for d, b in zip(days, bounds, strict=True)):
        stmt = _daily(by, days[0], days[-1], team).add_columns(DAILY.c.day).group_by(
            DAILY.c.day)
        for *sums, day in conn.execute(stmt):
            out[bisect.bisect_right(days, day) - 1].append(_row(*sums))
        return out
    window = sa.case(*((ENTRIES.c.at < b, i) for i, b in enumerate(bounds[1:-1])),
                     else_=len(bounds) - 2) if len(bounds) > 2 else sa.literal(0)
    for stmt in _statements(by, bounds[0], bounds[-1], team):
        for *sums, i in conn.execute(stmt.add_columns(window.label("w")).group_by("w")):
            out[int(i)].append(_row(*sums))
    return out


def hours_by(
    session: Session, by: GroupBy, start: datetime | None, end: datetime | None,
    team: str | None = None, *, daily: bool = True,
) -> Iterator[HoursRow]:
    """GPU-hours and cost per group and kind (usage and the waste kinds) of the ledger
    entries booked in [start, end), optionally of one team. A group and kind may come in more
    than one row (whole days, edges, entries from before and after revision 0010): callers add
    them up. `daily=False` sums the entries alone (what the daily sums must equal)."""
    conn = session.connection()
    _no_jit(conn)
    days, edges = split_days(start, end) if daily else (None, [(start, end)])
    stmts = [] if days is None else [_daily(by, *days, team)]
    for a, b in edges:
        stmts += _statements(by, a, b, team)
    for stmt in stmts:
        for sums in conn.execute(stmt):
            yield _row(*sums)
