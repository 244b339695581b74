"""Log lines of the control loop: one ``isthmus`` root logger in one format, and every line
logged while a control job runs carries the leader epoch, the loop and its cycle number, also
from the worker threads that call the backends for it."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backends.sim import SimBackend, SimClock, SimPoolSpec
from broker import logs
from broker.control.gate import GatedBackend
from broker.control.lease import LeaderLease
from broker.control.runtime import Intervals, Runtime
from broker.domain.inventory import InventorySnapshot
from broker.orchestration.submission import submit_job
from tests.builders import spec
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.server import free_port
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

FAST = Intervals(admission=0.2, dispatch=0.1, reconcile=0.2, lease_ttl=1.5)
CONTEXT = r"\[(?P<loop>[\w:-]+) epoch=(?P<epoch>\d+) cycle=(?P<cycle>\d+)\] "


@pytest.fixture
def log_text(restore_logging: None) -> io.StringIO:
    """The broker's own logging configuration, writing into a buffer."""
    buffer = io.StringIO()
    logs.configure(stream=buffer)
    return buffer


def test_logging_is_configured_before_the_backends_are_built(
    restore_logging: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A backend that cannot be built is logged while the server starts: that line already
    has the broker's format (it went through Python's bare last-resort output before)."""
    from broker import server
    from broker.wiring import runtime as wiring

    def broken(backend: Any, pools: object) -> Any:
        raise RuntimeError(f"no {backend.kind.value} client here")

    monkeypatch.setattr(wiring, "build_adapter", broken)
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)  # built, not served
    monkeypatch.setattr(Runtime, "start", lambda self: None)
    monkeypatch.setattr(Runtime, "stop", lambda self: None)
    server.run(EXAMPLE_CONFIG, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", port=free_port())
    err = capsys.readouterr().err
    line = next((x for x in err.splitlines() if "is not available" in x), None)
    assert line is not None, err
    assert re.match(r"\d{4}-\d\d-\d\d [\d:,]+ ERROR isthmus\.wiring\.runtime backend \S+ "
                    r"\(sim\) is not available: no sim client here$", line), line


def _lines(buffer: io.StringIO, text: str) -> list[str]:
    return [line for line in buffer.getvalue().splitlines() if text in line]


def test_every_module_logs_under_the_isthmus_root() -> None:
    assert logs.get_logger("broker.control.runtime").name == "isthmus.control.runtime"
    assert logs.get_logger("backends.slurm.adapter").name == "isthmus.backends.slurm.adapter"
    import backends.slurm.adapter
    import broker.control.guard
    import broker.control.runtime

    for module in (broker.control.runtime, broker.control.guard, backends.slurm.adapter):
        assert module.log.name.startswith("isthmus."), module.__name__


def test_control_loop_lines_carry_the_epoch_and_the_cycle(
    threaded_sim: Sim, log_text: io.StringIO
) -> None:
    sim = threaded_sim
    runtime = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="r1", ttl=FAST.lease_ttl), FAST)
    runtime.start()
    try:
        s = spec().flavors("h100-80g").build()
        submit_job(sim.plane.db, sim.plane.config, s, "t")
        wait_until(
            lambda: _lines(log_text, "admission cycle:") and _lines(log_text, ": created on sim-"),
            60, "an admission and a dispatch line", between=lambda: sim.advance(1),
        )
    finally:
        runtime.stop()
    admission = _lines(log_text, "admission cycle:")[0]
    dispatch = _lines(log_text, ": created on sim-")[0]
    for line, loop in ((admission, "admission"), (dispatch, "dispatch")):
        m = re.search(r" INFO isthmus\.[\w.]+ " + CONTEXT, line)
        assert m is not None, line
        assert (m["loop"], m["epoch"]) == (loop, "1") and int(m["cycle"]) >= 1, line
    leading = _lines(log_text, "leading the control loop")  # the lease keeper: no cycle
    assert leading and not re.search(CONTEXT, leading[0]), leading


class _LoggingSim(SimBackend):
    """A simulated backend whose inventory call logs, as an adapter's would."""

    def inventory(self) -> InventorySnapshot:
        logs.get_logger("backends.fake").info("inventory asked")
        return super().inventory()


def test_a_backend_worker_thread_carries_the_cycle_that_asked(log_text: io.StringIO) -> None:
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    gate = GatedBackend(_LoggingSim("b", "slurm", [SimPoolSpec("p", "h100")], clock))
    with logs.control_cycle("admission", 4, 9):
        gate.start_inventory().future.result(timeout=30)  # runs in the gate's worker thread
    gate.inventory()  # outside any cycle
    first, second = _lines(log_text, "inventory asked")
    assert "isthmus.backends.fake [admission epoch=4 cycle=9] inventory asked" in first
    assert "isthmus.backends.fake inventory asked" in second
