"""The wake chain of the runtime: a submission through the API is admitted, dispatched and seen
running long before any interval of the loop comes round (every interval here is 10 minutes),
and a wake that arrives while its control job runs is not lost."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control.lease import LeaderLease
from broker.control.runtime import RECONCILE_WAKE_GAP_S, Intervals, Runtime
from broker.store.queries import get_job
from tests.builders import spec
from tests.harness.runtime import QUICK_S, SLOW, idle, slow_runtime
from tests.harness.sim import Sim
from tests.harness.wait import wait_until


def _state(sim: Sim, job_id: str) -> str:
    with sim.plane.db.read() as s:
        job = get_job(s, job_id)
        return job.state if job is not None else "missing"


def test_a_submit_is_admitted_dispatched_and_seen_running_before_any_interval(
    threaded_sim: Sim,
) -> None:
    sim = threaded_sim
    runtime = slow_runtime(sim)
    runtime.start()
    stop = threading.Event()

    def backends_move() -> None:  # the simulated backends start what was created
        while not stop.wait(0.1):
            sim.advance(1)

    mover = threading.Thread(target=backends_move, daemon=True)
    try:
        # the first passes run when the lease is taken; after them only wakes run the loop
        wait_until(lambda: all(idle(runtime, j) for j in ("admission", "dispatch")), 60,
                   "the first admission and dispatch passes")
        mover.start()
        client = TestClient(create_app(sim.plane.config, sim.plane.db, runtime))
        body = spec().flavors("h100-80g").build().model_dump(mode="json", exclude_none=True)
        body["env"] = {"ISTHMUS_SIM_DURATION": "600"}
        answer = client.post("/v1/jobs", json=body)
        assert answer.status_code == 201, answer.text
        job = answer.json()["id"]
        # each poll gives up long before any interval (QUICK_S < SLOW.*): only wakes get there
        wait_until(lambda: _state(sim, job) in ("ADMITTED", "PREPARING", "RUNNING"), QUICK_S,
                   "the submit to wake the admission cycle", interval=0.02)
        wait_until(lambda: _state(sim, job) == "RUNNING", QUICK_S,
                   "admission to wake dispatch, and dispatch the reconciler", interval=0.02)
    finally:
        stop.set()
        runtime.stop()


def test_a_wake_while_the_job_runs_makes_it_run_again_one_gap_after_it_ended(
    threaded_sim: Sim,
) -> None:
    """The pass that is running may have read the queue before the commit that woke it: the
    job runs once more after that pass (APScheduler alone would skip the wake). Not at once:
    under a steady stream of wakes (a submit every 10 ms at 100/s) the pass is woken while it
    runs nearly every time, and run again at once, the loop ran its passes back to back. It
    runs again one gap after it ended."""
    sim = threaded_sim
    runtime = slow_runtime(sim)
    started = threading.Event()
    release = threading.Event()
    starts: list[float] = []
    ends: list[float] = []

    def slow_pass(_plane: object) -> None:
        starts.append(time.monotonic())
        started.set()
        if len(starts) == 1:
            release.wait(30)
        ends.append(time.monotonic())

    runtime._add("probe", slow_pass, SLOW.admission)
    runtime.start()
    try:
        wait_until(started.is_set, 60, "the first pass (on taking the lease)")
        runtime.wake("probe")  # arrives while the pass runs
        release.set()
        wait_until(lambda: len(starts) >= 2, QUICK_S, "the pass to run again after the wake")
        assert runtime.min_wake_gap > 0.1
        assert starts[1] - ends[0] >= runtime.min_wake_gap * 0.9
    finally:
        release.set()
        runtime.stop()


def test_a_run_skipped_as_the_pass_before_it_returned_is_asked_for_again(
    threaded_sim: Sim,
) -> None:
    """A wake that lands after the pass left `_running` but before its run returned to
    APScheduler is skipped by the scheduler (one instance at a time) and was lost: the job
    waited for its interval. The skip is seen and the run asked for again."""
    sim = threaded_sim
    runtime = slow_runtime(sim)
    passes: list[float] = []
    runtime._add("probe", lambda _p: passes.append(time.monotonic()), SLOW.admission)
    runtime.start()
    try:
        wait_until(lambda: len(passes) >= 1 and idle(runtime, "probe"), 60, "the first pass")
        # what the scheduler reports when it skips a run of a job still counted as running
        runtime._skipped(JobSubmissionEvent(EVENT_JOB_MAX_INSTANCES, "probe", "default",
                                            [datetime.now(UTC)]))
        wait_until(lambda: len(passes) >= 2, QUICK_S, "the skipped run to be asked again")
    finally:
        runtime.stop()


def test_wakes_closer_than_the_gap_are_deferred_not_dropped(threaded_sim: Sim) -> None:
    sim = threaded_sim
    runtime = slow_runtime(sim)
    passes: list[float] = []
    runtime._add("probe", lambda _p: passes.append(time.monotonic()), SLOW.admission)
    runtime.start()
    try:
        wait_until(lambda: len(passes) >= 1 and idle(runtime, "probe"), 60, "the first pass")
        runtime.wake("probe")
        wait_until(lambda: len(passes) >= 2 and idle(runtime, "probe"), QUICK_S, "a woken pass")
        runtime.wake("probe")  # within the gap of the previous wake (or just after it)
        wait_until(lambda: len(passes) >= 3, QUICK_S, "the second wake's pass")
    finally:
        runtime.stop()


def test_reconcilers_may_be_woken_more_often_than_the_admission_gap(threaded_sim: Sim) -> None:
    """After a dispatch, the follow-up wakes of the reconcilers are 0.1-0.2 s apart; merged into
    the admission-sized gap (0.5 s with the default intervals) a job was seen RUNNING up to half
    a second late (bench/vs_sbatch: extra p50 731 ms with the old gap, 199-441 ms with this)."""
    runtime = Runtime(threaded_sim.plane,
                      LeaderLease(threaded_sim.plane.db, holder="r1", ttl=15.0), Intervals())
    runtime.leading = True
    runtime._loop_ids = ["admission", "reconcile:slurm"]
    delays: dict[str, list[float]] = {"admission": [], "reconcile:slurm": []}
    runtime._schedule = lambda job_id, delay: delays[job_id].append(delay)  # type: ignore[method-assign]
    for job_id in delays:
        runtime.wake(job_id)
        runtime.wake(job_id)  # at once after the first: within the gap
    assert runtime.min_wake_gap == 0.5
    assert delays["admission"][0] == 0 and 0.45 < delays["admission"][1] <= 0.5
    assert delays["reconcile:slurm"][0] == 0
    assert RECONCILE_WAKE_GAP_S - 0.05 < delays["reconcile:slurm"][1] <= RECONCILE_WAKE_GAP_S
