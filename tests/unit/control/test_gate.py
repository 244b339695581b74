"""GatedBackend: one call at a time per adapter; waits for a busy adapter are bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from backends.base import BackendUnavailable, CancelResult, Capability
from broker.control.gate import GatedBackend
from broker.domain.facts import Fact
from tests.harness.wait import wait_until


class Hanging:
    """cancel and observe hang until released; lookup answers at once."""

    name, kind, capabilities = "slow", "slurm", Capability.NONE

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
    deadline = time.monotonic() + 10
    while "cancel" not in gate.busy_with():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return t


def test_a_busy_adapter_is_waited_for_within_the_lock_wait(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, lock_wait=5)  # type: ignore[arg-type]
    holder = _hold(gate)
    threading.Timer(0.3, hanging.release.set).start()
    assert gate.lookup("y") is None  # got the adapter once the cancel returned
    holder.join(5)


def test_waits_for_a_busy_adapter_are_bounded(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, lock_wait=0.5)  # type: ignore[arg-type]
    _hold(gate)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="busy: its cancel call has run for"):
        gate.lookup("y")
    assert 0.4 < time.monotonic() - started < 3
    # the holder has now run longer than the lock wait: later callers do not queue behind it
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="busy"):
        gate.lookup("z")
    assert time.monotonic() - started < 0.3


def test_observe_times_out_and_is_not_stacked(hanging: Hanging) -> None:
    gate = GatedBackend(hanging, observe_timeout=0.3)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"did not answer observe within 0\.3s"):
        gate.observe(["a"])
    assert time.monotonic() - started < 3
    with pytest.raises(BackendUnavailable, match="previous observe call"):
        gate.observe(["a"])  # at once: the first call still runs and holds the adapter
    hanging.release.set()
    deadline = time.monotonic() + 10
    while gate.in_flight("observe") is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
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
