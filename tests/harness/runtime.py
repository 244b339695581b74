"""A runtime whose intervals never come round in a test (10 minutes), so that whatever runs
its control jobs in time was a wake-up."""

from __future__ import annotations

from broker.control.lease import LeaderLease
from broker.control.runtime import Intervals, Runtime
from tests.harness.sim import Sim

SLOW = Intervals(admission=600.0, dispatch=600.0, reconcile=600.0, lease_ttl=1.5)
QUICK_S = 20.0
"""Generous for a loaded machine, and still 30 times shorter than any interval."""


def idle(runtime: Runtime, job_id: str) -> bool:
    """The control job has run at least once and is not running now."""
    return runtime._cycles.get(job_id, 0) >= 1 and job_id not in runtime._running


def slow_runtime(sim: Sim, holder: str = "r1") -> Runtime:
    return Runtime(sim.plane, LeaderLease(sim.plane.db, holder=holder, ttl=SLOW.lease_ttl), SLOW)
