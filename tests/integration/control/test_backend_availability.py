"""Truthful reasons and slow backends: a backend that cannot be reached, could not be built or
does not answer keeps its pools in the inventory, marked unavailable, and never delays the
decisions for the other backends by more than `inventory_wait`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from backends.base import SubmitRequest
from backends.sim.backend import SimBackend
from broker.config import IsthmusConfig
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.gate import GatedBackend, UnavailableBackend
from broker.control.inventories import Inventories
from broker.control.plane import ControlParams, ControlPlane
from broker.control.reconcile import run_reconcile
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot
from broker.store import Database
from broker.store import attempts as att
from broker.store.queries import get_job
from tests.builders import spec
from tests.harness.sim import Sim, submit
from tests.harness.wait import wait_until
from tests.integration.control.fakes import BlockingBackend


def _plane(sim: Sim, db: Database, config: IsthmusConfig, **backends: Any) -> ControlPlane:
    chosen = {**sim.backends, **{k.replace("_", "-"): v for k, v in backends.items()}}
    return ControlPlane(db, config, chosen, clock=lambda: sim.clock.now,
                        params=ControlParams(lost_grace_s=60))


def _job(plane: ControlPlane, job_id: str) -> tuple[str, str, str]:
    with plane.db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        return job.state, job.reason, job.message


H100 = spec().flavors("h100-80g").replicas(2).gpus(8)  # only slurm-h100 (sim-slurm) offers it
A100 = spec().flavors("a100-80g").replicas(2).gpus(8).backend("k8s")  # only k8s-a100


@pytest.fixture
def blocked(sim: Sim) -> Iterator[BlockingBackend]:
    backend = BlockingBackend(sim.backends["sim-slurm"])
    yield backend
    backend.release()  # lets the worker thread of the blocked call finish


def test_unreachable_backend_keeps_its_pools_and_says_so(sim: Sim) -> None:
    """Before: the pools of an unreachable backend were dropped and the job said
    NoFlavorFits: no pool currently offers h100-80g."""
    job = submit(sim, H100)
    sim.backends["sim-slurm"].reachable = False
    run_admission(sim.plane)
    state, reason, message = _job(sim.plane, job)
    assert (state, reason) == ("QUEUED", "BackendUnavailable")
    assert "backend sim-slurm unreachable since 2026-11-29T00:00:00Z" in message
    assert "simulated backend sim-slurm is unreachable" in message  # the last error
    pool = sim.plane.inventory().pool("slurm-h100")
    assert pool is not None and pool.unavailable and pool.total_gpus == 32  # configured shape
    assert pool.free_gpus == 0


def test_backend_that_could_not_be_built_is_a_reason(sim: Sim, db: Database,
                                                     sim_config: IsthmusConfig) -> None:
    broken = UnavailableBackend("sim-k8s", "k8s", "kubeconfig /nowhere: no such file")
    plane = _plane(sim, db, sim_config, sim_k8s=broken)
    a100, h100 = submit(sim, A100), submit(sim, H100)
    run_admission(plane)
    state, reason, message = _job(plane, a100)
    assert (state, reason) == ("QUEUED", "BackendUnavailable")
    assert "sim-k8s" in message and "kubeconfig /nowhere" in message
    assert _job(plane, h100)[0] == "ADMITTED"  # the other backend is not affected


def test_adapter_bug_in_inventory_stops_only_its_backend(sim: Sim, db: Database,
                                                         sim_config: IsthmusConfig) -> None:
    class Buggy(BlockingBackend):
        def inventory(self) -> InventorySnapshot:
            raise KeyError("nodes")

    plane = _plane(sim, db, sim_config, sim_slurm=Buggy(sim.backends["sim-slurm"]))
    a100, h100 = submit(sim, A100), submit(sim, H100)
    run_admission(plane)
    assert _job(plane, a100)[0] == "ADMITTED"
    state, reason, message = _job(plane, h100)
    assert (state, reason) == ("QUEUED", "BackendUnavailable")
    assert "KeyError" in message


def test_blocked_backend_delays_the_others_by_the_inventory_wait_only(
    sim: Sim, db: Database, sim_config: IsthmusConfig, blocked: BlockingBackend
) -> None:
    """Before: admission called each backend in turn and waited for the blocked one (until
    its call gave up: `limit` here, a hung scontrol's timeout) before deciding anything.

    Decided by what happened, not by how long it took on this machine: the cycle returned
    with every decision written while the blocked call still hangs (so it stopped waiting at
    its deadline, `inventory_wait_s`, not at the call's end), and the job that needs the
    blocked backend waits for the reason that says so (a cycle that had waited for the call
    to give up would say "unreachable" with the call's error instead)."""
    blocked.block()  # answers only when the test releases it, at teardown
    blocked.limit = 120.0  # far beyond the inventory wait, and past any cycle on a busy machine
    plane = _plane(sim, db, sim_config, sim_slurm=blocked)
    assert plane.params.inventory_wait_s < blocked.limit
    a100, h100 = submit(sim, A100), submit(sim, H100)
    run_admission(plane)
    assert blocked.ended == []  # the cycle is over, and it did not wait for the call to end
    wait_until(lambda: blocked.hanging == ["inventory"], 60, "the call to hang (it was made)")
    assert _job(plane, a100)[0] == "ADMITTED"
    state, reason, message = _job(plane, h100)
    assert (state, reason) == ("QUEUED", "BackendUnavailable")
    assert "backend sim-slurm has not answered since" in message


def test_slow_backend_is_served_from_its_last_inventory(
    sim: Sim, db: Database, sim_config: IsthmusConfig, blocked: BlockingBackend
) -> None:
    plane = _plane(sim, db, sim_config, sim_slurm=blocked)
    run_admission(plane)  # answers: the cache holds sim-slurm's inventory
    blocked.block()
    h100 = submit(sim, H100)
    run_admission(plane)
    assert _job(plane, h100)[0] == "ADMITTED"
    with plane.db.read() as s:
        saved = att.get_explanation(s, h100)
    assert saved is not None  # what `isthmus explain` shows
    assert "inventory of sim-slurm as of 2026-11-29T00:00:00Z: no answer within 1s" in saved[1]


def test_a_stale_inventory_holds_the_gpus_of_attempts_made_since(
    sim: Sim, db: Database, sim_config: IsthmusConfig, blocked: BlockingBackend
) -> None:
    """The stale snapshot cannot show a gang placed after it was taken; once the backend has
    reported that gang, admission no longer holds its GPUs itself, so the plane must."""
    plane = _plane(sim, db, sim_config, sim_slurm=blocked)
    job = submit(sim, H100)
    run_admission(plane)  # the inventory taken here is the one served stale below
    run_dispatch(plane)
    run_reconcile(plane, "sim-slurm")
    with plane.db.read() as s:
        (a,) = att.live(s, "sim-slurm")
    assert a.job_id == job and a.last_seen_at is not None
    blocked.block()
    pool = plane.inventory().pool("slurm-h100")
    assert pool is not None and pool.stale
    assert pool.free_gpus == 32 - 16


def test_a_too_old_inventory_is_not_served(sim: Sim, db: Database,
                                           sim_config: IsthmusConfig,
                                           blocked: BlockingBackend) -> None:
    plane = ControlPlane(db, sim_config, {**sim.backends, "sim-slurm": blocked},
                         clock=lambda: sim.clock.now,
                         params=ControlParams(inventory_max_age_s=0.0))
    run_admission(plane)
    blocked.block()
    h100 = submit(sim, H100)
    run_admission(plane)
    state, reason, message = _job(plane, h100)
    assert (state, reason) == ("QUEUED", "BackendUnavailable")
    assert "its last inventory is older than 0s" in message


def test_a_late_answer_refreshes_the_cache(sim: Sim, blocked: BlockingBackend) -> None:
    gate = GatedBackend(blocked)
    inventories = Inventories(lambda: sim.clock.now, wait=0.2, max_age=60)
    blocked.block()
    first = inventories.gather({"sim-slurm": gate})["sim-slurm"]
    assert first.snapshot is None and "has not answered" in first.note
    blocked.release()
    wait_until(lambda: gate.in_flight("inventory") is None, 60, "the late answer",
               interval=0.01)
    blocked.block()
    second = inventories.gather({"sim-slurm": gate})["sim-slurm"]
    assert second.stale and second.snapshot is not None
    assert second.snapshot.pool("slurm-h100") is not None


def test_slow_observe_is_a_reason_after_its_timeout(sim: Sim, db: Database,
                                                    sim_config: IsthmusConfig,
                                                    blocked: BlockingBackend) -> None:
    plane = ControlPlane(db, sim_config, {**sim.backends, "sim-slurm": blocked},
                         clock=lambda: sim.clock.now,
                         params=ControlParams(observe_timeout_s=0.5))
    job = submit(sim, H100)
    run_admission(plane)
    run_dispatch(plane)
    blocked.block()
    blocked.limit = 120.0  # far beyond the observe timeout
    report = run_reconcile(plane, "sim-slurm")
    assert report.unreachable
    assert blocked.ended == []  # the pass gave up on the call at its timeout
    wait_until(lambda: blocked.hanging == ["observe"], 60, "the call to hang (it was made)")
    state, reason, message = _job(plane, job)
    assert (state, reason) == ("PREPARING", "BackendUnavailable")
    assert "did not answer observe within 0.5s" in message


class Overlaps:
    """Counts calls that enter an adapter while another call is inside it."""

    def __init__(self, inner: SimBackend) -> None:
        self.inner, self.name, self.kind = inner, inner.name, inner.kind
        self.inside = 0
        self.overlaps = 0
        self._count = threading.Lock()

    def _enter(self) -> None:
        with self._count:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1
        time.sleep(0.005)  # widen the window, as a real backend call would

    def _leave(self) -> None:
        with self._count:
            self.inside -= 1

    def _call(self, fn: Any, *args: Any) -> Any:
        self._enter()
        try:
            return fn(*args)
        finally:
            self._leave()

    def inventory(self) -> InventorySnapshot:
        return self._call(self.inner.inventory)

    def render(self, request: SubmitRequest) -> Any:
        return self._call(self.inner.render, request)

    def submit(self, request: SubmitRequest) -> Any:
        return self._call(self.inner.submit, request)

    def lookup(self, name: str) -> Fact | None:
        return self._call(self.inner.lookup, name)

    def cancel(self, name: str, grace_seconds: int) -> Any:
        return self._call(self.inner.cancel, name, grace_seconds)

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        return self._call(self.inner.observe, names)


def test_control_passes_in_threads_never_enter_one_adapter_together(
    sim: Sim, db: Database, sim_config: IsthmusConfig
) -> None:
    """Before: admission, dispatch and the reconciler called the same adapter at once."""
    watched = {n: Overlaps(b) for n, b in sim.backends.items()}
    plane = ControlPlane(db, sim_config, watched, clock=lambda: sim.clock.now)
    for i in range(6):
        submit(sim, spec().name(f"j{i}").flavors("a100-80g").replicas(1).gpus(8).backend("k8s"))
        submit(sim, spec().name(f"h{i}").flavors("h100-80g").replicas(1).gpus(8))
    stop = threading.Event()
    errors: list[BaseException] = []
    runs = [0, 0, 0, 0]  # passes made by each thread

    def loop(i: int, fn: Any) -> None:
        while not stop.is_set():
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
                return
            runs[i] += 1

    passes = [lambda: run_admission(plane), lambda: run_dispatch(plane),
              lambda: run_reconcile(plane, "sim-slurm"), lambda: run_reconcile(plane, "sim-k8s")]
    threads = [threading.Thread(target=loop, args=(i, fn)) for i, fn in enumerate(passes)]
    for t in threads:
        t.start()
    try:  # every pass several times, all four threads at once: each met the others often
        wait_until(lambda: errors or min(runs) >= 10, 120, "ten passes of each thread",
                   interval=0.05)
    finally:
        stop.set()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert {n: w.overlaps for n, w in watched.items()} == {"sim-slurm": 0, "sim-k8s": 0}
    with db.read() as s:
        assert att.live(s)  # the passes did run: attempts exist
