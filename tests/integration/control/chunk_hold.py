"""Holding a control-loop chunk after it decided its writes and before it sends them, to
show that a cancel of one of its jobs is answered meanwhile (the chunk locks its jobs only
for its writes: broker.store.records.lock_unmoved)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from broker.orchestration.submission import cancel_job
from broker.store import records
from tests.harness.sim import Sim


class ChunkHold:
    """`calls` records, in order, each decided step ("decided") and, once `record_locks`
    is called, each lock of the chunk's jobs: first ("locked", records.lock_jobs) or before
    the writes ("checked", records.lock_unmoved)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.decided, self.go = threading.Event(), threading.Event()
        self.calls: list[str] = []

    def after(self, owner: object, name: str, when: Callable[[list[str]], bool]) -> None:
        """Hold the chunk after the call of `owner.name` (a step that decides and queues
        writes) at which `when(calls)` is first true, until the cancel was tried."""
        original = getattr(owner, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.calls.append("decided")
            if not self.decided.is_set() and when(self.calls):
                self.decided.set()
                assert self.go.wait(60)
            return result

        self.monkeypatch.setattr(owner, name, held)

    def record_locks(self) -> None:
        locking, checking = records.lock_jobs, records.lock_unmoved

        def locked(session: Any, job_ids: list[str]) -> Any:
            self.calls.append("locked")
            return locking(session, job_ids)

        def checked(session: Any, seen: dict[str, int]) -> None:
            self.calls.append("checked")
            checking(session, seen)

        self.monkeypatch.setattr(records, "lock_jobs", locked)
        self.monkeypatch.setattr(records, "lock_unmoved", checked)

    def cancel_meanwhile(self, sim: Sim, run: Callable[[], Any], job_id: str,
                         why: str) -> dict[str, Any]:
        """Run the pass (`run`) in a thread; once its chunk is held, cancel `job_id`, which
        must be answered within 30 s while the chunk is still held (`why` otherwise); then
        let the chunk go. Returns the pass's result ("r") and the cancel's ("c")."""
        out: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: out.update(r=run()))
        worker.start()
        try:
            assert self.decided.wait(60)
            cancelled = threading.Thread(
                target=lambda: out.update(c=cancel_job(sim.plane.db, job_id, "tester", False)))
            cancelled.start()
            cancelled.join(30)  # locked during the deciding, it waits for `go`: never set
            assert not cancelled.is_alive(), why
        finally:
            self.go.set()
            worker.join(60)
        return out
