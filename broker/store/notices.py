"""The notices outbox and its deliveries (tables `notices`, `notice_deliveries`).

`add` writes a notice in the caller's transaction (the one of the event it tells of); the
leader's delivery pass (broker/control/notices.py) reads notices not yet expanded, writes one
delivery per target, and sends the due deliveries, recording each outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store import batch
from broker.store.tables import (
    ATTEMPTS,
    EVENTS,
    JOBS,
    NOTICES,
)
from broker.store.tables import NOTICE_DELIVERIES as DELIVERIES

PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"
WEBHOOK, EMAIL = "webhook", "email"
MAX_ERROR = 500
"""Characters of a delivery's last error kept (a receiver's answer is bounded before storing)."""

_INSERT = sa.insert(NOTICES)


def add(session: Session, *, key: str, kind: str, team: str, at: datetime,
        job_id: str | None = None, event_seq: int | None = None,
        details: dict[str, Any] | None = None) -> None:
    """Write a notice in the caller's transaction (queued with the batch's writes inside
    `batch.deferred`). `key` is unique: one notice per event (or per budget crossing)."""
    batch.write(session, _INSERT, {
        "key": key, "kind": kind, "job_id": job_id, "event_seq": event_seq, "team": team,
        "at": at, "details_json": json.dumps(details, sort_keys=True) if details else None,
        "expanded": False,
    })


@dataclass(frozen=True, slots=True)
class Notice:
    """A notice with what its body tells: the job and the event behind it."""

    id: int
    key: str
    kind: str
    team: str
    at: datetime
    details: dict[str, Any]
    job_id: str | None
    job_number: int | None
    job_name: str | None
    spec_json: str | None
    state: str | None
    reason: str | None
    message: str | None
    failure: str | None  # the event's attempt's failure category


def _notices_with_jobs() -> sa.Select[Any]:
    ev = EVENTS.alias("ev")
    return (
        sa.select(NOTICES.c.id, NOTICES.c.key, NOTICES.c.kind, NOTICES.c.team, NOTICES.c.at,
                  NOTICES.c.details_json, NOTICES.c.job_id, JOBS.c.number, JOBS.c.name,
                  JOBS.c.spec_json, ev.c.to_state, ev.c.reason, ev.c.message,
                  ATTEMPTS.c.failure)
        .select_from(NOTICES)
        .outerjoin(JOBS, JOBS.c.id == NOTICES.c.job_id)
        .outerjoin(ev, sa.and_(ev.c.job_id == NOTICES.c.job_id,
                               ev.c.seq == NOTICES.c.event_seq))
        .outerjoin(ATTEMPTS, sa.and_(ATTEMPTS.c.job_id == NOTICES.c.job_id,
                                     ATTEMPTS.c.number == ev.c.attempt))
    )


def _notice(row: Any) -> Notice:
    return Notice(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]) if row[5] else {},
                  *row[6:])


def has_unexpanded(session: Session) -> bool:
    return session.connection().execute(
        sa.select(NOTICES.c.id).where(NOTICES.c.expanded.is_(False)).limit(1)).first() is not None


def unexpanded(session: Session, limit: int) -> list[Notice]:
    """Notices whose targets are not resolved yet, oldest first."""
    rows = session.connection().execute(
        _notices_with_jobs().where(NOTICES.c.expanded.is_(False))
        .order_by(NOTICES.c.id).limit(limit))
    return [_notice(r) for r in rows]


def expand(session: Session, notice_id: int, targets: list[tuple[str, str]],
           now: datetime) -> None:
    """Record the targets (channel, target) of a notice, due now, and mark it expanded."""
    conn = session.connection()
    if targets:
        conn.execute(sa.insert(DELIVERIES), [
            {"notice_id": notice_id, "channel": channel, "target": target, "status": PENDING,
             "attempts": 0, "next_try_at": now, "last_error": "", "delivered_at": None}
            for channel, target in sorted(set(targets))])
    conn.execute(sa.update(NOTICES).where(NOTICES.c.id == notice_id).values(expanded=True))


@dataclass(frozen=True, slots=True)
class Delivery:
    id: int
    notice_id: int
    channel: str
    target: str
    status: str
    attempts: int
    next_try_at: datetime
    last_error: str
    delivered_at: datetime | None


_DELIVERY_COLS = [DELIVERIES.c[n] for n in (
    "id", "notice_id", "channel", "target", "status", "attempts", "next_try_at", "last_error",
    "delivered_at")]


def due(session: Session, now: datetime, limit: int) -> list[tuple[Delivery, Notice]]:
    """Pending deliveries whose next try is due, oldest first, each with its notice."""
    rows = session.connection().execute(
        sa.select(*_DELIVERY_COLS)
        .where(DELIVERIES.c.status == PENDING, DELIVERIES.c.next_try_at <= now)
        .order_by(DELIVERIES.c.next_try_at, DELIVERIES.c.id).limit(limit)).all()
    if not rows:
        return []
    deliveries = [Delivery(*r) for r in rows]
    ids = sorted({d.notice_id for d in deliveries})
    notices = {n.id: n for n in map(_notice, session.connection().execute(
        _notices_with_jobs().where(NOTICES.c.id.in_(ids))))}
    return [(d, notices[d.notice_id]) for d in deliveries]


def record(session: Session, delivery_id: int, *, status: str, attempts: int,
           next_try_at: datetime, error: str, delivered_at: datetime | None) -> None:
    """One try's outcome. Only a pending delivery changes (a delivery is finished once)."""
    session.connection().execute(
        sa.update(DELIVERIES)
        .where(DELIVERIES.c.id == delivery_id, DELIVERIES.c.status == PENDING)
        .values(status=status, attempts=attempts, next_try_at=next_try_at,
                last_error=error[:MAX_ERROR], delivered_at=delivered_at))


def retry_dead(session: Session, delivery_id: int, now: datetime) -> bool:
    """Give a dead delivery a fresh set of tries (an admin fixed the receiver), due `now`."""
    result = session.connection().execute(
        sa.update(DELIVERIES).where(DELIVERIES.c.id == delivery_id, DELIVERIES.c.status == DEAD)
        .values(status=PENDING, attempts=0, next_try_at=now))
    return bool(result.rowcount)


@dataclass(frozen=True, slots=True)
class Listed:
    delivery: Delivery
    kind: str
    team: str
    job_id: str | None
    at: datetime


def listing(session: Session, status: str | None, team: str | None,
            limit: int) -> list[Listed]:
    """Deliveries, newest notices first (the dead-letter view: status DEAD)."""
    q = (sa.select(*_DELIVERY_COLS, NOTICES.c.kind, NOTICES.c.team, NOTICES.c.job_id,
                   NOTICES.c.at)
         .join(NOTICES, NOTICES.c.id == DELIVERIES.c.notice_id))
    if status is not None:
        q = q.where(DELIVERIES.c.status == status)
    if team is not None:
        q = q.where(NOTICES.c.team == team)
    rows = session.connection().execute(
        q.order_by(DELIVERIES.c.notice_id.desc(), DELIVERIES.c.id).limit(limit))
    return [Listed(Delivery(*r[:9]), r[9], r[10], r[11], r[12]) for r in rows]


def existing_keys(session: Session, keys: list[str]) -> set[str]:
    """The keys among `keys` that a notice already has."""
    if not keys:
        return set()
    rows = session.connection().execute(
        sa.select(NOTICES.c.key).where(NOTICES.c.key.in_(sorted(set(keys)))))
    return {r[0] for r in rows}
