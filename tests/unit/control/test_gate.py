"""GatedBackend: one call at a time per adapter; waits for a busy adapter are bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from backends.base import BackendUnavailable, CancelResult
from broker.control.gate import GatedBackend
from broker.domain.facts import Fact
from tests.harness.wait import wait_until


class Hanging:
    """cancel and observe hang until released; lookup answers at once."""

    name, kind = "slow", "slurm"

    def __init__(self) -> None:
        self.release = threading.Event()

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        self.release.wait(30)
        return CancelResult(name, True, False)

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        self.release.wait(30)
        return []

    def lookup(self, name: str) -> Fact | None:
        return None


@pytest.fixture
def hanging() -> Iterator[Hanging]:
    backend = Hanging()
    yield backend
    backend.release.set()


def _hold(gate: GatedBackend) -> threading.Thread:
    """Start a cancel that holds the adapter until released; return once it holds it."""
    t = threading.Thread(target=gate.cancel, args=("x", 0), daemon=True)
    t.start()
    wait_until(lambda: "cancel" in gate.busy_with(), 60, "the cancel to hold the adapter",
               interval=0.01)
    return t


class Acquires:
    """The adapter's lock, logging how long each caller was willing to wait for it (0: not
    at all): the gate's waits told by what it asked for, not by a clock."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.waits: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.waits.append(timeout if blocking else 0.0)
        return bool(self.lock.acquire(blocking, timeout))

    def release(self) -> None:
        self.lock.release()


def test_a_busy_adapter_is_waited_for_within_the_lock_wait(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, lock_wait=5)  # type: ignore[arg-type]
    holder = _hold(gate)
    threading.Timer(0.3, hanging.release.set).start()
    assert gate.lookup("y") is None  # got the adapter once the cancel returned
    holder.join(5)


def test_waits_for_a_busy_adapter_are_bounded(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, lock_wait=0.5)  # type: ignore[arg-type]
    holder = _hold(gate)
    gate._lock = lock = Acquires(gate._lock)  # type: ignore[assignment]
    with pytest.raises(BackendUnavailable, match="busy: its cancel call has run for"):
        gate.lookup("y")
    assert lock.waits == [0.5]  # waited its lock wait for the adapter ...
    assert holder.is_alive() and "cancel" in gate.busy_with()  # ... not for the cancel to end
    # the holder has now run longer than the lock wait: later callers do not queue behind it
    with pytest.raises(BackendUnavailable, match="busy"):
        gate.lookup("z")
    assert lock.waits == [0.5, 0.0]


def test_observe_times_out_and_is_not_stacked(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, observe_timeout=0.3)  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailable, match=r"did not answer observe within 0\.3s"):
        gate.observe(["a"])
    assert gate.in_flight("observe") is not None  # the caller went on; the call did not end
    with pytest.raises(BackendUnavailable, match="previous observe call"):
        gate.observe(["a"])  # at once: the first call still runs and holds the adapter
    hanging.release.set()
    wait_until(lambda: gate.in_flight("observe") is None, 60, "the released observe to end",
               interval=0.01)
    assert gate.observe(["a"]) == []


def test_a_change_feed_is_handed_through_the_gate_and_its_lock_is_not_taken(
    hanging: Hanging,
) -> None:
    feeds: list[object] = []
    setattr(hanging, "on_change", feeds.append)
    gate = GatedBackend(hanging, lock_wait=0.1)  # type: ignore[arg-type]
    threading.Thread(target=lambda: gate.cancel("x", 0), daemon=True).start()
    wait_until(lambda: gate._holder is not None, 10, "the cancel to hold the adapter's lock")

    def wake() -> None:
        pass

    assert gate.on_change(wake) is True  # at once, although a call holds the adapter
    assert feeds == [wake]


def test_a_backend_without_a_change_feed_says_so(hanging: Hanging) -> None:
    gate = GatedBackend(hanging)  # type: ignore[arg-type]
    assert gate.on_change(lambda: None) is False
