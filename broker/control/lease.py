"""Leadership: one lease row that a replica must hold to run the control loop.

A lease has a holder, an expiry and an epoch. The epoch increases each time another replica
takes over, so work stamped with an old epoch can be recognised as stale (a fencing token).
Works on SQLite and PostgreSQL alike; on PostgreSQL several replicas share one database.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from broker.store.db import Database
from broker.store.tables import LeaderLeaseRow, utcnow

LEASES: sa.Table = LeaderLeaseRow.__table__  # type: ignore[attr-defined]


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class LeaderLease:
    db: Database
    name: str = "control"
    holder: str = ""
    ttl: float = 15.0
    epoch: int = 0

    def __post_init__(self) -> None:
        self.holder = self.holder or default_holder()

    def try_acquire(self, now: datetime | None = None) -> bool:
        """Take or renew the lease. True while this replica leads."""
        now = now or utcnow()
        expires = now + timedelta(seconds=self.ttl)
        try:
            with self.db.write() as s:
                conn = s.connection()
                row = conn.execute(
                    sa.select(LEASES).where(LEASES.c.name == self.name).with_for_update()
                ).first()
                if row is None:
                    conn.execute(
                        sa.insert(LEASES).values(
                            name=self.name, holder=self.holder, epoch=1, expires_at=expires
                        )
                    )
                    self.epoch = 1
                    return True
                expired = row.expires_at.replace(tzinfo=now.tzinfo) <= now
                if row.holder != self.holder and not expired:
                    return False
                epoch = row.epoch if row.holder == self.holder else row.epoch + 1
                conn.execute(
                    sa.update(LEASES)
                    .where(LEASES.c.name == self.name)
                    .values(holder=self.holder, epoch=epoch, expires_at=expires)
                )
                self.epoch = epoch
                return True
        except IntegrityError:
            return False  # another replica created the row at the same moment

    def release(self) -> None:
        """Give the lease up at once (clean shutdown), so a standby need not wait for expiry."""
        with self.db.write() as s:
            s.connection().execute(
                sa.update(LEASES)
                .where(LEASES.c.name == self.name, LEASES.c.holder == self.holder)
                .values(expires_at=utcnow() - timedelta(seconds=1))
            )

    def current(self) -> tuple[str, int, datetime] | None:
        with self.db.read() as s:
            row = s.connection().execute(
                sa.select(LEASES).where(LEASES.c.name == self.name)
            ).first()
        return None if row is None else (row.holder, row.epoch, row.expires_at)
