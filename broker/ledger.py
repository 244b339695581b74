"""The quota ledger: append-only entries per (job, attempt, kind) and live usage counters.

`reserve` and `release` are idempotent (the unique key is job, attempt, kind) and update the
per-(team, flavor) counter in the same transaction, so `quota_usage` always equals the sum of
reservations that have no release. `check` proves it. The counters are written at the
transaction's commit, last and in key order (broker.store.quota_counters), not where the
reservation or release happens.

GPU-hours: `charge` books an ended attempt once, whatever its ending. Its usage entry is every
GPU-hour the attempt held (from its backend object's creation to its end); the waste entries
are the parts of that usage that bought nothing, one entry per kind:

| ending                              | waste besides `waste:preparing` (always)           |
|-------------------------------------|----------------------------------------------------|
| succeeded                           | none                                               |
| failed (user, infra, environment)   | `waste:failed`: the whole run                      |
| lost (the backend forgot it)        | `waste:lost`: the run since the last checkpoint    |
| preempted (by a backend or Isthmus) | `waste:preempted`: the run since the last checkpt. |
| cancelled (by a user or an admin)   | `waste:cancelled`: the run since the last checkpt. |

`waste:preparing` is the time GPUs were held before every rank ran. A checkpoint reported
through the progress API marks work that survives into the next attempt; an attempt that never
reported one loses its whole run. Every usage and waste entry carries its `cost`: GPU-hours x the
flavor's cost weight x the pool's cost weight, and (from revision 0010) the attempt's pool and
the job's submitter, which the usage report groups by. Every usage and waste entry is also
added to the ledger's per-day sums (ledger_daily), at the transaction's commit like the
counters (broker.store.daily_sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store import batch, daily_sums, ledger_lookups
from broker.store import quota_counters as counters
from broker.store.in_lists import in_chunks, pair_params, pairs_in
from broker.store.tables import ATTEMPTS, JOBS
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

USAGE = counters.USAGE


class LedgerKind(StrEnum):
    RESERVE = "reserve"
    RELEASE = "release"
    USAGE = "usage"  # every GPU-hour an attempt held
    WASTE = "waste"  # before revision 0007: all of an attempt's waste in one entry
    WASTE_PREPARING = "waste:preparing"
    WASTE_FAILED = "waste:failed"
    WASTE_LOST = "waste:lost"
    WASTE_PREEMPTED = "waste:preempted"
    WASTE_CANCELLED = "waste:cancelled"


HOURS_KINDS = frozenset({LedgerKind.USAGE, LedgerKind.WASTE, LedgerKind.WASTE_PREPARING,
                         LedgerKind.WASTE_FAILED, LedgerKind.WASTE_LOST,
                         LedgerKind.WASTE_PREEMPTED, LedgerKind.WASTE_CANCELLED})
WASTE_KINDS = HOURS_KINDS - {LedgerKind.USAGE}


class Ending(StrEnum):
    """How an attempt ended, as far as accounting cares."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"


# The waste kind of an ending's run (succeeded wastes no run).
_RUN_WASTE = {
    Ending.FAILED: LedgerKind.WASTE_FAILED, Ending.LOST: LedgerKind.WASTE_LOST,
    Ending.PREEMPTED: LedgerKind.WASTE_PREEMPTED, Ending.CANCELLED: LedgerKind.WASTE_CANCELLED,
}


@dataclass(frozen=True, slots=True)
class Held:
    """What one attempt held: `gpus` from `since` (its backend object exists; None if it never
    did) to `until`; every rank ran from `running` (None: never); `progress` is its last
    reported checkpoint."""

    gpus: int
    since: datetime | None
    until: datetime
    running: datetime | None = None
    progress: datetime | None = None


def _hours(gpus: int, start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds()) / 3600 * gpus


def split(held: Held, ending: Ending) -> dict[LedgerKind, float]:
    """Usage and waste (GPU-hours by kind) of an attempt; pure. Waste never exceeds usage:
    every instant is clamped into [since, until]."""
    if held.since is None or held.gpus <= 0:
        return {LedgerKind.USAGE: 0.0}
    since, until = held.since, max(held.since, held.until)

    def clamp(t: datetime) -> datetime:
        return min(max(t, since), until)

    running = clamp(held.running) if held.running is not None else None
    out = {LedgerKind.USAGE: _hours(held.gpus, since, until),
           LedgerKind.WASTE_PREPARING: _hours(held.gpus, since, running or until)}
    kind = _RUN_WASTE.get(ending)
    if kind is not None and running is not None:
        if ending is Ending.FAILED or held.progress is None:
            lost_from = running
        else:
            lost_from = max(running, clamp(held.progress))
        out[kind] = _hours(held.gpus, lost_from, until)
    return {k: v for k, v in out.items() if v > 0 or k is LedgerKind.USAGE}


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    attempt: int
    team: str
    flavor: str
    gpus: int
    borrowed_gpus: int = 0


# Statements are built once with bind parameters, so SQLAlchemy reuses their compiled form.
_ENTRY = sa.select(ENTRIES).where(
    ENTRIES.c.job_id == sa.bindparam("job_id"),
    ENTRIES.c.attempt == sa.bindparam("attempt"),
    ENTRIES.c.kind == sa.bindparam("kind"),
)
_INSERT_ENTRY = sa.insert(ENTRIES)
# the attempt's pool and the job's submitter, written on usage and waste entries for reports
_WHO = (
    sa.select(ATTEMPTS.c.pool, JOBS.c.submitted_by)
    .select_from(JOBS.outerjoin(ATTEMPTS, sa.and_(
        ATTEMPTS.c.job_id == JOBS.c.id, ATTEMPTS.c.number == sa.bindparam("attempt"))))
    .where(JOBS.c.id == sa.bindparam("job_id"))
)
# in a batch, summed per counter and handed to the counters' commit-time write
batch.additive(counters.UPSERT, key=("t", "f"), apply=counters.add_many)


def _entry(session: Session, job_id: str, attempt: int, kind: LedgerKind) -> Any:
    """The entry, from the transaction's read-ahead (broker.store.ledger_lookups) when it
    holds the key, else from the database."""
    known, row = ledger_lookups.lookup(session, job_id, attempt, kind.value)
    if known:
        return row
    return session.connection().execute(
        _ENTRY, {"job_id": job_id, "attempt": attempt, "kind": kind.value}
    ).first()


def reserve(session: Session, r: Reservation, now: datetime, note: str = "") -> bool:
    """Reserve GPUs for an attempt. False when this attempt already holds its reservation.

    Inside a batch of deferred writes (broker.store.batch) the look-up is left to the unique
    key (job, attempt, kind): a second reservation fails the batch's flush, and the caller
    redoes the batch job by job, where this returns False as always."""
    if not batch.active(session) and _entry(
        session, r.job_id, r.attempt, LedgerKind.RESERVE
    ) is not None:
        return False
    params = {"job_id": r.job_id, "attempt": r.attempt, "kind": LedgerKind.RESERVE.value,
              "team": r.team, "flavor": r.flavor, "gpus": r.gpus,
              "borrowed_gpus": r.borrowed_gpus, "gpu_hours": 0.0, "at": now, "note": note,
              "cost": None}
    batch.write(session, _INSERT_ENTRY, params)  # both writes may be batched across jobs
    ledger_lookups.learn(session, params)
    if batch.active(session):  # summed over the batch, then noted like a single change
        batch.write(session, counters.UPSERT, {"t": r.team, "f": r.flavor, "g": r.gpus,
                                               "b": r.borrowed_gpus})
    else:
        counters.add(session, r.team, r.flavor, r.gpus, r.borrowed_gpus)  # written at commit
    return True


def release(session: Session, job_id: str, attempt: int, now: datetime, note: str = "") -> bool:
    """Release an attempt's reservation. False when there is none or it was released."""
    held = _entry(session, job_id, attempt, LedgerKind.RESERVE)
    if held is None or _entry(session, job_id, attempt, LedgerKind.RELEASE) is not None:
        return False
    params = {"job_id": job_id, "attempt": attempt, "kind": LedgerKind.RELEASE.value,
              "team": held.team, "flavor": held.flavor, "gpus": held.gpus,
              "borrowed_gpus": held.borrowed_gpus, "gpu_hours": 0.0, "at": now, "note": note}
    batch.write(session, _INSERT_ENTRY, params)  # queued inside a batch (a reconcile chunk)
    ledger_lookups.learn(session, params)
    counters.add(session, held.team, held.flavor, -held.gpus, -held.borrowed_gpus)  # at commit
    return True


def record_hours(
    session: Session, r: Reservation, kind: LedgerKind, gpu_hours: float, now: datetime,
    note: str = "",
) -> bool:
    """Record GPU-hours used or wasted by an attempt (once per attempt and kind). Ended
    attempts are booked by `charge`, which splits the waste by kind and prices it."""
    if kind not in HOURS_KINDS:
        raise ValueError(f"record_hours takes usage or waste, not {kind}")
    if _entry(session, r.job_id, r.attempt, kind) is not None:
        return False
    session.connection().execute(
        _INSERT_ENTRY,
        {"job_id": r.job_id, "attempt": r.attempt, "kind": kind.value, "team": r.team,
         "flavor": r.flavor, "gpus": r.gpus, "borrowed_gpus": 0, "gpu_hours": gpu_hours,
         "at": now, "note": note},
    )
    # no pool or user on this entry: summed under its attempt's pool and job's submitter
    _note_daily(session, r, kind, now, gpu_hours, None, _who(session, r))
    return True


Who = tuple[str | None, str | None]
"""An attempt's pool and its job's submitter (None when the rows are gone)."""


def _who(session: Session, r: Reservation) -> Who:
    row = session.connection().execute(_WHO, {"job_id": r.job_id, "attempt": r.attempt}).first()
    return (row.pool, row.submitted_by) if row is not None else (None, None)


def _note_daily(session: Session, r: Reservation, kind: LedgerKind, at: datetime,
                gpu_hours: float, cost: float | None, who: Who) -> None:
    """Add an entry to its day's sums (written at commit)."""
    pool, user = who
    daily_sums.note(session, team=r.team, flavor=r.flavor, kind=kind.value, at=at,
                    gpu_hours=gpu_hours, cost=cost, pool=pool or "", user=user or "")


def charge(
    session: Session, r: Reservation, held: Held, ending: Ending, cost_weight: float,
    now: datetime, note: str = "", who: Who | None = None,
) -> dict[LedgerKind, float]:
    """Book an ended attempt's usage and waste, once: its usage entry says it was booked, so
    every later call (another path that saw the same ending) books nothing and returns {}.
    `cost_weight`: the flavor's cost weight times the pool's. `who`: the attempt's pool and
    the job's submitter when the caller has them (else read here). Its entries are sent as
    one statement (queued inside a batch)."""
    if _entry(session, r.job_id, r.attempt, LedgerKind.USAGE) is not None:
        return {}
    hours = split(held, ending)
    if who is None:
        who = _who(session, r)
    pool, user = who
    text = f"{ending.value}; weight {cost_weight:g}" + (f"; {note}" if note else "")
    rows = [{"job_id": r.job_id, "attempt": r.attempt, "kind": kind.value, "team": r.team,
             "flavor": r.flavor, "gpus": r.gpus, "borrowed_gpus": 0, "gpu_hours": value,
             "cost": value * cost_weight, "pool": pool, "submitted_by": user, "at": now,
             "note": text} for kind, value in hours.items()]
    if batch.active(session):
        for params in rows:
            batch.write(session, _INSERT_ENTRY, params)
    else:
        session.connection().execute(_INSERT_ENTRY, rows)
    for params in rows:
        ledger_lookups.learn(session, params)
    for kind, value in hours.items():
        _note_daily(session, r, kind, now, value, value * cost_weight, who)
    return hours


def uncharged_attempts(session: Session) -> int:
    """Ended attempts whose backend object existed and that have no usage entry: GPU-hours
    nobody booked (0 when every ending path charges)."""
    booked = sa.exists().where(
        ENTRIES.c.job_id == ATTEMPTS.c.job_id, ENTRIES.c.attempt == ATTEMPTS.c.number,
        ENTRIES.c.kind == LedgerKind.USAGE.value,
    )
    return int(session.connection().execute(
        sa.select(sa.func.count()).select_from(ATTEMPTS).where(
            ATTEMPTS.c.ended_at.is_not(None), ATTEMPTS.c.dispatch == "created", ~booked)
    ).scalar_one())


def usage(session: Session) -> dict[tuple[str, str], tuple[int, int]]:
    """Live (reserved, borrowed) GPUs per (team, flavor), from the counters (with what this
    transaction changed and writes at its commit)."""
    rows = session.connection().execute(sa.select(USAGE))
    out = {(r.team, r.flavor): (r.reserved_gpus, r.borrowed_gpus) for r in rows}
    for key, (g, b) in counters.pending(session).items():
        g0, b0 = out.get(key, (0, 0))
        out[key] = (g0 + g, b0 + b)
    return out


def live_reservations(session: Session) -> dict[tuple[str, str], tuple[int, int]]:
    """The same figures recomputed from the entries: reservations without a release."""
    sign = sa.case((ENTRIES.c.kind == LedgerKind.RESERVE, 1), else_=-1)
    rows = session.connection().execute(
        sa.select(
            ENTRIES.c.team, ENTRIES.c.flavor,
            sa.func.sum(sign * ENTRIES.c.gpus), sa.func.sum(sign * ENTRIES.c.borrowed_gpus),
        )
        .where(ENTRIES.c.kind.in_([LedgerKind.RESERVE, LedgerKind.RELEASE]))
        .group_by(ENTRIES.c.team, ENTRIES.c.flavor)
    )
    return {(t, f): (int(g or 0), int(b or 0)) for t, f, g, b in rows}


def check(session: Session) -> list[str]:
    """Mismatches between the counters and the entries (empty when consistent)."""
    counted, recomputed = usage(session), live_reservations(session)
    out = []
    for key in sorted(set(counted) | set(recomputed)):
        a, b = counted.get(key, (0, 0)), recomputed.get(key, (0, 0))
        if a != b:
            out.append(f"quota_usage {key[0]}/{key[1]}: counter {a} != entries {b}")
    return out


def borrowed_of(session: Session, job_id: str, attempt: int) -> int:
    """GPUs of an attempt's reservation that lie above its team's nominal quota."""
    row = _entry(session, job_id, attempt, LedgerKind.RESERVE)
    return int(row.borrowed_gpus) if row is not None else 0


def borrowed_of_many(session: Session,
                     keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """`borrowed_of` for many attempts (job id, number), a few statements in all; attempts
    without a reservation are left out (0 borrowed)."""
    out: dict[tuple[str, int], int] = {}
    conn = session.connection()
    for chunk in in_chunks(keys):
        rows = conn.execute(_RESERVATIONS_OF, pair_params("keys", chunk))
        out.update({(r.job_id, r.attempt): int(r.borrowed_gpus) for r in rows})
    return out


_RESERVATIONS_OF = sa.select(ENTRIES.c.job_id, ENTRIES.c.attempt, ENTRIES.c.borrowed_gpus).where(
    ENTRIES.c.kind == LedgerKind.RESERVE.value,
    pairs_in(ENTRIES.c.job_id, ENTRIES.c.attempt, "keys"),
)
"""Built once; the job ids beside the pairs let SQLite search the entries' index (a row-value
IN list alone made it read every ledger entry)."""
