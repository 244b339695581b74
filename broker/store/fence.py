"""Fenced writes: a control-loop transaction commits only while its writer still holds the
epoch it was given when it took the lease.

A leader that is paused (SIGSTOP, a long GC, a frozen VM) past its lease's expiry does not
know it was deposed; when it wakes up, its scheduled passes carry on where they stopped. Each
of their transactions ends with a look at the lease row under a row lock (`SELECT ... FOR
SHARE` on PostgreSQL; SQLite's write lock, taken at BEGIN IMMEDIATE, serialises it there):
if the epoch moved on, the transaction is rolled back and `Deposed` raised, which the runtime
turns into stepping down. The lock is held from the check to the commit, so a take-over (an
UPDATE of the row, which waits for every share of it) either commits before the check (and
is seen) or waits for the commit (and the write was the last one of the old epoch, made while
it still led). The lock is shared so that the loop's own transactions (the passes run in
threads of their own) do not wait for each other's commits at their fence.

What a fence cannot stop: a backend call made before the refused write (a dispatch's submit,
a preemption's signal). The dispatcher's lookup-by-name before create makes the new leader
adopt such an object instead of duplicating it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlmodel import Session

from broker.logs import get_logger
from broker.store.db import Database
from broker.store.tables import LEASES

log = get_logger(__name__)


class Deposed(RuntimeError):
    """This replica's epoch is no longer the lease's: its write was refused (rolled back)."""

    def __init__(self, lease: str, mine: int, current: int | None) -> None:
        self.lease, self.mine, self.current = lease, mine, current
        now = "no lease row" if current is None else f"the lease is at epoch {current}"
        super().__init__(f"write of epoch {mine} refused: {now} ({lease})")


_EPOCH = (sa.select(LEASES.c.epoch).where(LEASES.c.name == sa.bindparam("lease"))
          .with_for_update(read=True))  # FOR SHARE
"""Built once (its compiled form reused): every write of the control loop ends with it."""


def check_epoch(session: Session, lease: str, epoch: int) -> None:
    """Raise Deposed unless the lease `lease` is at `epoch`; holds a share of the lease row's
    lock until the transaction ends (a take-over's update of the row waits for it)."""
    current = session.connection().execute(_EPOCH, {"lease": lease}).scalar()
    if current != epoch:
        raise Deposed(lease, epoch, current)


@dataclass
class FencedDatabase(Database):
    """The database as the control loop writes to it: `write()` commits only while the lease
    is at the writer's epoch (read through `epoch`, which follows the runtime's leadership).
    Reads and everything else are the underlying database's."""

    lease: str = "control"
    epoch: Callable[[], int] = field(default=lambda: 0)
    refused: int = 0
    """Writes refused so far (a deposed leader's); logged each time."""

    @classmethod
    def over(cls, db: Database, lease: str, epoch: Callable[[], int]) -> FencedDatabase:
        """`db` fenced (same engines, same SQLite write lock, so both queue on one lock)."""
        return cls(url=db.url, writer=db.writer, reader=db.reader,
                   _write_lock=db._write_lock, lease=lease, epoch=epoch)

    def unfenced(self) -> Database:
        """The same database without the fence (the lease itself must be written by anyone)."""
        return Database(url=self.url, writer=self.writer, reader=self.reader,
                        _write_lock=self._write_lock)

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        with super().write() as session:
            yield session
            epoch = self.epoch()
            if epoch == 0:  # never led: not a control-loop write (the loop runs only leading)
                return
            try:
                check_epoch(session, self.lease, epoch)
            except Deposed as exc:
                self.refused += 1
                log.warning("fenced: %s; refused writes so far: %d", exc, self.refused)
                raise
