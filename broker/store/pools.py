"""Admin state of pools (drain / undrain), kept in the database so every replica sees it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.tables import POOL_STATE


@dataclass(frozen=True, slots=True)
class PoolState:
    pool: str
    drained: bool
    reason: str
    actor: str
    updated_at: datetime


def pool_states(session: Session) -> dict[str, PoolState]:
    rows = session.connection().execute(sa.select(POOL_STATE))
    return {r.pool: PoolState(r.pool, r.drained, r.reason, r.actor, r.updated_at) for r in rows}


def set_drained(
    session: Session, pool: str, drained: bool, reason: str, actor: str, now: datetime
) -> None:
    conn = session.connection()
    values = {"drained": drained, "reason": reason, "actor": actor, "updated_at": now}
    if not conn.execute(
        sa.update(POOL_STATE).where(POOL_STATE.c.pool == pool).values(**values)
    ).rowcount:
        conn.execute(sa.insert(POOL_STATE).values(pool=pool, **values))
