"""The ledger's per-day sums (`ledger_daily`), written once per transaction at its commit.

Each usage or waste entry adds to four rows shared by every job of its team and day (one per
grouping: team, pool, flavor, user). Until revision 0013 a trigger added them at each insert,
so a transaction held those rows' locks from its first booking to its commit, and took them in
the order it booked: on PostgreSQL two reconcile passes (one per backend) and the other
writers of the ledger deadlocked on them under the soak. Here an entry is only noted (`note`);
the session's commit writes the sum per row, last, in key order, after the quota counters
(broker.store.quota_counters, whose listener this module's import registers first), so every
transaction takes these locks at its very end and in one order.

What a rolled-back savepoint noted is dropped with it; a rolled-back transaction drops
everything. A writer that inserts entries without `note` (a bulk load with COPY) adds their
sums with `add_entries` in the same transaction; `mismatches` compares the table with the
entries (`isthmus db check`).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

# imported first, so that the counters' commit writer is registered (and runs) before this one's
from broker.store import batch, commit_notes, quota_counters  # noqa: F401
from broker.store.attempts import ATTEMPTS
from broker.store.records import JOBS
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

_KEY = "isthmus_daily_sums"
DIMS = ("team", "pool", "flavor", "user")
NOT_HOURS = ("reserve", "release")
SUMS = ("gpu_hours", "cost", "unpriced_gpu_hours")
Key = tuple[str, date, str, str, str]  # dim, day, team, value, kind: the primary key's order

assert DAILY.name == "ledger_daily"
UPSERT = sa.text(
    "INSERT INTO ledger_daily (dim, day, team, value, kind, gpu_hours, cost, "
    "unpriced_gpu_hours, entries) VALUES (:dim, :day, :team, :value, :kind, :h, :c, :u, :n) "
    "ON CONFLICT (dim, day, team, value, kind) DO UPDATE SET "
    "gpu_hours = ledger_daily.gpu_hours + excluded.gpu_hours, "
    "cost = ledger_daily.cost + excluded.cost, "
    "unpriced_gpu_hours = ledger_daily.unpriced_gpu_hours + excluded.unpriced_gpu_hours, "
    "entries = ledger_daily.entries + excluded.entries"
).bindparams(sa.bindparam("day", type_=sa.Date))
# a key's sums are added: two rows of one key are never sent as one (apply sends one a key)
batch.upsert_rows(UPSERT, DAILY, keys=("dim", "day", "team", "value", "kind"), last_wins=False)


def note(session: Session, *, team: str, flavor: str, kind: str, at: datetime,
         gpu_hours: float, cost: float | None, pool: str, user: str) -> None:
    """Note one usage or waste entry (reserve and release are not summed), written at commit.
    `pool` and `user`: the entry's, else its attempt's pool and its job's submitter, else ''."""
    if kind in NOT_HOURS:
        return
    day = at.astimezone(UTC).date()
    unpriced = gpu_hours if cost is None else 0.0
    for dim, value in zip(DIMS, (team, pool, flavor, user), strict=True):
        commit_notes.note(session, _KEY,
                          ((dim, day, team, value, kind), gpu_hours, cost or 0.0, unpriced))


def pending(session: Session) -> dict[Key, tuple[float, float, float, int]]:
    """(GPU-hours, cost, unpriced GPU-hours, entries) noted per row and not yet written."""
    return _summed_notes(commit_notes.noted(session, _KEY))


def _summed_notes(items: list[tuple[Any, ...]]) -> dict[Key, tuple[float, float, float, int]]:
    sums: dict[Key, tuple[float, float, float, int]] = {}
    for key, h, c, u in items:
        h0, c0, u0, n0 = sums.get(key, (0.0, 0.0, 0.0, 0))
        sums[key] = (h0 + h, c0 + c, u0 + u, n0 + 1)
    return sums


def apply(session: Session) -> None:
    """Write the noted sums: one row each, in key order, in one executemany (called by
    commit; executemany sends its rows in order)."""
    sums = _summed_notes(commit_notes.take(session, _KEY))
    if sums:
        batch.execute_many(session.connection(), UPSERT, [
            {"dim": k[0], "day": k[1], "team": k[2], "value": k[3], "kind": k[4],
             "h": h, "c": c, "u": u, "n": n} for k, (h, c, u, n) in sorted(sums.items())])


def _day(dialect: str) -> sa.ColumnElement[Any]:
    """An entry's UTC day as ledger_daily stores it ('YYYY-MM-DD' text on SQLite, which keeps
    times as 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC)."""
    if dialect == "postgresql":
        return sa.cast(sa.func.timezone("UTC", ENTRIES.c.at), sa.Date)
    return sa.func.substr(ENTRIES.c.at, 1, 10)


def _value(dim: str) -> sa.ColumnElement[Any]:
    """An entry's group in `dim`: pool and user looked up as the reports do when missing."""
    if dim in ("team", "flavor"):
        return ENTRIES.c.team if dim == "team" else ENTRIES.c.flavor
    if dim == "pool":
        found = sa.select(ATTEMPTS.c.pool).where(
            ATTEMPTS.c.job_id == ENTRIES.c.job_id, ATTEMPTS.c.number == ENTRIES.c.attempt)
        return sa.func.coalesce(ENTRIES.c.pool, found.scalar_subquery(), "")
    found = sa.select(JOBS.c.submitted_by).where(JOBS.c.id == ENTRIES.c.job_id)
    return sa.func.coalesce(ENTRIES.c.submitted_by, found.scalar_subquery(), "")


def _summed(dim: str, dialect: str, where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The sums of the entries matching `where`, per row of `dim`, columns as ledger_daily's."""
    day, value = _day(dialect), _value(dim)
    unpriced = sa.case((ENTRIES.c.cost.is_(None), ENTRIES.c.gpu_hours), else_=0.0)
    return (sa.select(sa.literal(dim).label("dim"), day.label("day"), ENTRIES.c.team,
                      value.label("value"), ENTRIES.c.kind,
                      sa.func.sum(ENTRIES.c.gpu_hours).label("gpu_hours"),
                      sa.func.sum(sa.func.coalesce(ENTRIES.c.cost, 0.0)).label("cost"),
                      sa.func.sum(unpriced).label("unpriced_gpu_hours"),
                      sa.func.count().label("entries"))
            .where(ENTRIES.c.kind.not_in(NOT_HOURS), where)
            .group_by(day, ENTRIES.c.team, value, ENTRIES.c.kind))


def add_entries(session: Session, where: sa.ColumnElement[bool]) -> None:
    """Add the sums of the entries matching `where` (inserted without `note`: a bulk load),
    one statement per grouping. Each matching entry must not have been summed before."""
    conn = session.connection()
    insert: Any = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    for dim in DIMS:
        stmt = insert(DAILY).from_select(
            [c.name for c in DAILY.columns], _summed(dim, conn.dialect.name, where))
        added = {c: DAILY.c[c] + stmt.excluded[c] for c in (*SUMS, "entries")}
        conn.execute(stmt.on_conflict_do_update(
            index_elements=["dim", "day", "team", "value", "kind"], set_=added))


def mismatches(session: Session, limit: int = 20) -> list[str]:
    """Rows of ledger_daily that differ from the sums of the entries (empty when equal; the
    sums within a relative 1e-9, the counts exactly), at most `limit`."""
    conn = session.connection()
    stored = sa.select(DAILY.c.dim, DAILY.c.day, DAILY.c.team, DAILY.c.value, DAILY.c.kind,
                       *((-DAILY.c[c]).label(c) for c in SUMS), (-DAILY.c.entries).label("entries"))
    both = sa.union_all(stored, *(_summed(d, conn.dialect.name, sa.true())
                                  for d in DIMS)).subquery()
    key = [both.c.dim, both.c.day, both.c.team, both.c.value, both.c.kind]
    sums = [sa.func.sum(both.c[c]) for c in SUMS]
    size = [sa.func.sum(sa.func.abs(both.c[c])) for c in SUMS]
    off = sa.or_(sa.func.sum(both.c.entries) != 0,
                 *(sa.func.abs(d) > 1e-9 * s + 1e-9 for d, s in zip(sums, size, strict=True)))
    rows = conn.execute(sa.select(*key, *sums, sa.func.sum(both.c.entries))
                        .group_by(*key).having(off).order_by(*key).limit(limit))
    return [f"ledger_daily {dim}/{day}/{team}/{value}/{kind}: entries minus stored "
            f"gpu_hours {float(h):+.6g} cost {float(c):+.6g} unpriced {float(u):+.6g} "
            f"entries {int(n):+d}"
            for dim, day, team, value, kind, h, c, u, n in rows]


def rebuild(session: Session) -> int:
    """ledger_daily written anew from the entries, in the caller's transaction; the number of
    rows it now holds. For a table that drifted (entries inserted by a replica of a version
    before revision 0013, whose trigger this revision dropped; `isthmus db check` names the
    rows). On PostgreSQL the table is locked first (EXCLUSIVE: reads go on), so that a writer
    committing meanwhile adds its sums after the rebuild, never into the rows it replaces."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("LOCK TABLE ledger_daily IN EXCLUSIVE MODE"))
    conn.execute(sa.delete(DAILY))
    for dim in DIMS:
        conn.execute(sa.insert(DAILY).from_select(
            [c.name for c in DAILY.columns], _summed(dim, conn.dialect.name, sa.true())))
    return int(conn.execute(sa.select(sa.func.count()).select_from(DAILY)).scalar_one())


commit_notes.register(_KEY, lambda session: apply(session))  # looked up when called
