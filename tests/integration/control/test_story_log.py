"""The INFO log tells each job's changes of state, once committed; reasons alone, and cycles
that only looked, stay at DEBUG."""

from __future__ import annotations

import logging

import pytest

from broker.control.admission import run_admission
from broker.domain import JobState, Reason
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from tests.builders import spec
from tests.harness.sim import Sim, run_until, submit


def _info(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and r.name.startswith("isthmus")]


def test_the_info_log_tells_a_jobs_changes_and_nothing_of_idle_cycles(
        sim: Sim, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="isthmus")
    job = submit(sim, spec().name("told").flavors("a100-80g").replicas(1).topology(None), 60)
    run_until(sim, job, "SUCCEEDED", step=20)
    told = [m for m in _info(caplog) if m.startswith(f"job {job} ")]
    moves = [m.split(": ")[1].split(" (")[0] for m in told]
    assert moves == ["SUBMITTED -> VALIDATING", "VALIDATING -> QUEUED",
                     "QUEUED -> ADMITTED", "ADMITTED -> PREPARING", "PREPARING -> RUNNING",
                     "RUNNING -> SUCCEEDED"], told
    assert "told, team vision, attempt 1" in told[-1]
    caplog.clear()
    for _ in range(5):
        run_admission(sim.plane)  # nothing waits
    assert _info(caplog) == []


def test_a_rolled_back_change_is_not_told(sim: Sim, caplog: pytest.LogCaptureFixture) -> None:
    job = submit(sim, spec().name("undone").flavors("a100-80g").replicas(1).topology(None), 60)
    caplog.set_level(logging.INFO, logger="isthmus")
    caplog.clear()
    with pytest.raises(RuntimeError), sim.plane.db.write() as s:
        set_state(s, job, JobState.CANCELLED, Reason.CancelledByUser, Cause("api", "me"))
        raise RuntimeError("the transaction fails")
    assert not [m for m in _info(caplog) if "CANCELLED" in m]
