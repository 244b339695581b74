"""What wakes the admission cycle after the API queued work (new jobs committed, a pool put
back in service): the runtime of this replica when it leads the control loop, otherwise the
leader, wherever it runs, through PostgreSQL NOTIFY (broker.store.notify). On SQLite there is
one process, so the local runtime is the only one to wake."""

from __future__ import annotations

from collections.abc import Callable

from broker.control.runtime import Runtime
from broker.store.db import Database
from broker.store.notify import Notifier, supported


def admission_waker(db: Database, runtime: Runtime | None) -> Callable[[], None] | None:
    """A function to call after such a commit (cheap, never blocks, never raises), or None
    when there is nothing to wake (SQLite without a control loop)."""
    notifier = Notifier(db) if supported(db) else None
    if runtime is None and notifier is None:
        return None

    def wake() -> None:
        if runtime is not None and runtime.leading:
            runtime.wake("admission")
        elif notifier is not None:
            notifier.poke()

    return wake
