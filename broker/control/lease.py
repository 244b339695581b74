"""Leadership: one lease row that a replica must hold to run the control loop.

A lease has a holder, an expiry and an epoch. The epoch increases each time another replica
takes over, so work stamped with an old epoch can be recognised as stale (a fencing token).
Works on SQLite and PostgreSQL alike; on PostgreSQL several replicas share one database.

Expiry is judged by the database's clock, never the replica's: replicas whose clocks disagree
still agree on when a lease ends. Writes of the control loop check the epoch at commit
(broker/store/fence.py), so a leader paused past its expiry cannot write once another took over.
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
from broker.store.db_clock import db_now
from broker.store.fence import FencedDatabase
from broker.store.tables import LEASES


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
        if isinstance(self.db, FencedDatabase):  # taking the lease is what the fence guards
            self.db = self.db.unfenced()

    def try_acquire(self, now: datetime | None = None) -> bool:
        """Take or renew the lease. True while this replica leads. `now` (tests only) stands
        in for the database's clock."""
        try:
            with self.db.write() as s:
                conn = s.connection()
                row = conn.execute(
                    sa.select(LEASES).where(LEASES.c.name == self.name).with_for_update()
                ).first()
                # the clock read once the row is ours: a wait for the lock (the fenced writes
                # in flight share it, broker.store.fence) does not shorten the renewed lease
                now = now or db_now(conn)
                expires = now + timedelta(seconds=self.ttl)
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
            conn = s.connection()
            conn.execute(
                sa.update(LEASES)
                .where(LEASES.c.name == self.name, LEASES.c.holder == self.holder)
                .values(expires_at=db_now(conn) - timedelta(seconds=1))
            )

    def current(self) -> tuple[str, int, datetime] | None:
        with self.db.read() as s:
            row = s.connection().execute(
                sa.select(LEASES).where(LEASES.c.name == self.name)
            ).first()
        return None if row is None else (row.holder, row.epoch, row.expires_at)
