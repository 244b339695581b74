"""The runtime follows the backends: a change feed (a Kubernetes backend's watches) wakes that
backend's reconciler, and a reconcile pass that moved a job wakes the admission cycle, long
before any interval comes round (every interval here is 10 minutes)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from apscheduler.schedulers.base import STATE_STOPPED

from broker.control import runtime as runtime_module
from broker.control.lease import LeaderLease
from broker.control.plane import ControlPlane
from broker.control.reconcile import ReconcileReport
from tests.harness.runtime import QUICK_S, SLOW, idle, slow_runtime
from tests.harness.sim import Sim
from tests.harness.wait import wait_until


def test_a_backend_change_feed_wakes_its_reconciler(threaded_sim: Sim) -> None:
    name = next(iter(threaded_sim.plane.backends))
    feeds: list[Callable[[], None]] = []
    setattr(threaded_sim.backends[name], "on_change", feeds.append)
    runtime = slow_runtime(threaded_sim)
    runtime.start()
    job = f"reconcile:{name}"
    try:
        wait_until(lambda: idle(runtime, job), 60, "the first reconcile pass")
        assert len(feeds) == 1, "the runtime follows the backend's change feed"
        before = runtime._cycles[job]
        feeds[0]()  # e.g. a pod of a gang ended
        wait_until(lambda: runtime._cycles.get(job, 0) > before, QUICK_S,
                   "the change to wake the reconciler", interval=0.02)
    finally:
        runtime.stop()


def test_a_standby_does_not_follow_the_change_feeds_until_it_leads(
    threaded_sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following a feed starts a Kubernetes backend's watches, whose caches only the leader's
    reconciler reads and prunes: a standby replica must not hold them (a soak's standby grew
    10 MB a minute with them). It follows them once it leads, and once only."""
    name = next(iter(threaded_sim.plane.backends))
    feeds: list[Callable[[], None]] = []
    setattr(threaded_sim.backends[name], "on_change", feeds.append)
    other = LeaderLease(threaded_sim.plane.db, holder="other", ttl=600.0)
    assert other.try_acquire()
    runtime = slow_runtime(threaded_sim)
    tries = {"n": 0}
    acquire = runtime.lease.try_acquire

    def counted(now: object = None) -> bool:
        tries["n"] += 1
        return acquire()

    monkeypatch.setattr(runtime.lease, "try_acquire", counted)
    runtime.start()
    try:
        wait_until(lambda: tries["n"] >= 3, QUICK_S, "the standby to try the lease")
        assert not runtime.leading
        assert feeds == [], "a standby follows no change feed"
        other.release()
        wait_until(lambda: runtime.leading, QUICK_S, "the standby to take the lease")
        with runtime._lock:  # leading is set first, then the feeds followed, under this lock
            assert len(feeds) == 1, "the leader follows the feed"
        runtime.step_down()
        wait_until(lambda: runtime.leading, QUICK_S, "the lease to be taken again")
        with runtime._lock:
            assert len(feeds) == 1, "a feed is followed once, not once per leadership"
    finally:
        runtime.stop()


def test_a_reconcile_pass_that_moved_a_job_wakes_admission(
    threaded_sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = {"now": False}

    def run_reconcile(plane: ControlPlane, backend_name: str) -> ReconcileReport:
        return ReconcileReport(observed=1, transitions=1 if moved["now"] else 0)

    monkeypatch.setattr(runtime_module, "run_reconcile", run_reconcile)
    runtime = slow_runtime(threaded_sim)
    runtime.start()
    reconciler = f"reconcile:{next(iter(threaded_sim.plane.backends))}"
    try:
        wait_until(lambda: all(idle(runtime, j) for j in ("admission", reconciler)), 60,
                   "the first passes")
        before = runtime._cycles["admission"]
        moved["now"] = True  # e.g. a job ended: its GPUs and quota are free
        runtime.wake(reconciler)
        wait_until(lambda: runtime._cycles["admission"] > before, QUICK_S,
                   "the reconcile pass to wake admission", interval=0.02)
    finally:
        runtime.stop()


def test_stop_returns_while_a_control_job_wakes_another(threaded_sim: Sim) -> None:
    """The scheduler's shutdown holds its job-store lock while it waits for the running jobs; a
    job that wakes another at that moment (a reconcile that moved a job wakes admission) once
    waited for that lock for ever, and `stop` with it (seen as a hung test run)."""
    runtime = slow_runtime(threaded_sim)
    started, release = threading.Event(), threading.Event()

    def probe(_plane: ControlPlane) -> None:
        started.set()
        release.wait(30)
        runtime.wake("admission")

    runtime._add("probe", probe, SLOW.admission)
    runtime.start()
    stopper = threading.Thread(target=runtime.stop, daemon=True)
    try:
        wait_until(started.is_set, 60, "the probe to run")
        stopper.start()
        # the shutdown marks the scheduler stopped, then takes its lock and waits for the
        # probe; the probe, released now, wakes admission after that (public state only)
        wait_until(lambda: runtime.scheduler.state == STATE_STOPPED, QUICK_S,
                   "the shutdown to begin", interval=0.01)
    finally:
        release.set()
    stopper.join(QUICK_S)
    assert not stopper.is_alive(), "stop() hung on a wake made during the shutdown"
