"""What wakes the admission cycle after the API queued work (new jobs committed, a pool put
back in service): the runtime of this replica when it leads the control loop, otherwise the
leader, wherever it runs, through PostgreSQL NOTIFY (broker.store.notify). On SQLite there is
one process, so the local runtime is the only one to wake."""

from __future__ import annotations

from broker.control.runtime import Runtime
from broker.store.db import Database
from broker.store.notify import Notifier, supported


class AdmissionWaker:
    """Call it after such a commit: cheap, never blocks, never raises. `stop` ends the
    notifier's thread (the app's shutdown)."""

    def __init__(self, runtime: Runtime | None, notifier: Notifier | None) -> None:
        self.runtime, self.notifier = runtime, notifier

    def __call__(self) -> None:
        if self.runtime is not None and self.runtime.leading:
            self.runtime.wake("admission")
        elif self.notifier is not None:
            self.notifier.poke()

    def stop(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()


def admission_waker(db: Database, runtime: Runtime | None) -> AdmissionWaker | None:
    """The waker for this replica, or None when there is nothing to wake (SQLite without a
    control loop)."""
    notifier = Notifier(db) if supported(db) else None
    if runtime is None and notifier is None:
        return None
    return AdmissionWaker(runtime, notifier)
