"""The quota ledger: append-only entries per (job, attempt, kind) and live usage counters.

`reserve` and `release` are idempotent (the unique key is job, attempt, kind) and update the
per-(team, flavor) counter in the same transaction, so `quota_usage` always equals the sum of
reservations that have no release. `check` proves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.tables import LedgerEntryRow, QuotaUsageRow

ENTRIES: sa.Table = LedgerEntryRow.__table__  # type: ignore[attr-defined]
USAGE: sa.Table = QuotaUsageRow.__table__  # type: ignore[attr-defined]


class LedgerKind(StrEnum):
    RESERVE = "reserve"
    RELEASE = "release"
    USAGE = "usage"  # GPU-hours used by an attempt, weighted by flavor cost
    WASTE = "waste"  # GPU-hours lost: preparing time, failed attempts, work since checkpoint


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
_RELEASE = (
    sa.update(USAGE)
    .where(USAGE.c.team == sa.bindparam("t"), USAGE.c.flavor == sa.bindparam("f"))
    .values(
        reserved_gpus=USAGE.c.reserved_gpus - sa.bindparam("g"),
        borrowed_gpus=USAGE.c.borrowed_gpus - sa.bindparam("b"),
    )
)


# One text statement for both databases (SQLite >= 3.24 and PostgreSQL share this syntax): the
# dialects' on_conflict_do_update constructs have no cache key, so SQLAlchemy compiled them again
# on every call, a fifth of the time of admitting a job.
assert USAGE.name == "quota_usage"
_UPSERT = sa.text(
    "INSERT INTO quota_usage (team, flavor, reserved_gpus, borrowed_gpus) "
    "VALUES (:t, :f, :g, :b) ON CONFLICT (team, flavor) DO UPDATE SET "
    "reserved_gpus = quota_usage.reserved_gpus + excluded.reserved_gpus, "
    "borrowed_gpus = quota_usage.borrowed_gpus + excluded.borrowed_gpus"
)


def _entry(session: Session, job_id: str, attempt: int, kind: LedgerKind) -> Any:
    return session.connection().execute(
        _ENTRY, {"job_id": job_id, "attempt": attempt, "kind": kind.value}
    ).first()


def _bump(session: Session, team: str, flavor: str, gpus: int, borrowed: int) -> None:
    conn = session.connection()
    if gpus < 0:  # a release: the row exists (SQLite checks CHECKs on the would-be insert)
        conn.execute(_RELEASE, {"t": team, "f": flavor, "g": -gpus, "b": -borrowed})
        return
    conn.execute(_UPSERT, {"t": team, "f": flavor, "g": gpus, "b": borrowed})


def reserve(session: Session, r: Reservation, now: datetime, note: str = "") -> bool:
    """Reserve GPUs for an attempt. False when this attempt already holds its reservation."""
    if _entry(session, r.job_id, r.attempt, LedgerKind.RESERVE) is not None:
        return False
    session.connection().execute(
        _INSERT_ENTRY,
        {"job_id": r.job_id, "attempt": r.attempt, "kind": LedgerKind.RESERVE.value,
         "team": r.team, "flavor": r.flavor, "gpus": r.gpus, "borrowed_gpus": r.borrowed_gpus,
         "gpu_hours": 0.0, "at": now, "note": note},
    )
    _bump(session, r.team, r.flavor, r.gpus, r.borrowed_gpus)
    return True


def release(session: Session, job_id: str, attempt: int, now: datetime, note: str = "") -> bool:
    """Release an attempt's reservation. False when there is none or it was released."""
    held = _entry(session, job_id, attempt, LedgerKind.RESERVE)
    if held is None or _entry(session, job_id, attempt, LedgerKind.RELEASE) is not None:
        return False
    session.connection().execute(
        _INSERT_ENTRY,
        {"job_id": job_id, "attempt": attempt, "kind": LedgerKind.RELEASE.value,
         "team": held.team, "flavor": held.flavor, "gpus": held.gpus,
         "borrowed_gpus": held.borrowed_gpus, "gpu_hours": 0.0, "at": now, "note": note},
    )
    _bump(session, held.team, held.flavor, -held.gpus, -held.borrowed_gpus)
    return True


def record_hours(
    session: Session, r: Reservation, kind: LedgerKind, gpu_hours: float, now: datetime,
    note: str = "",
) -> bool:
    """Record GPU-hours used or wasted by an attempt (once per attempt and kind)."""
    if kind not in (LedgerKind.USAGE, LedgerKind.WASTE):
        raise ValueError(f"record_hours takes usage or waste, not {kind}")
    if _entry(session, r.job_id, r.attempt, kind) is not None:
        return False
    session.connection().execute(
        _INSERT_ENTRY,
        {"job_id": r.job_id, "attempt": r.attempt, "kind": kind.value, "team": r.team,
         "flavor": r.flavor, "gpus": r.gpus, "borrowed_gpus": 0, "gpu_hours": gpu_hours,
         "at": now, "note": note},
    )
    return True


def usage(session: Session) -> dict[tuple[str, str], tuple[int, int]]:
    """Live (reserved, borrowed) GPUs per (team, flavor), from the counters."""
    rows = session.connection().execute(sa.select(USAGE))
    return {(r.team, r.flavor): (r.reserved_gpus, r.borrowed_gpus) for r in rows}


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
