"""One writer per adapter, under load: admission, dispatch, one reconciler and a stream of
submissions and cancellations run in their own threads against one real adapter (the local
Slurm cluster, the local Kubernetes control plane) for half a minute (jobs of two seconds, a
dozen alive at a time: a few dozen lifecycles, each pass run hundreds of times). No control pass may
raise, and the database must replay cleanly afterwards (what `isthmus db check` checks)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import ledger
from broker.config import load_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.domain import JobSpec
from broker.orchestration.replay import check_all
from broker.orchestration.submission import cancel_job, submit_job
from broker.store import Database, open_database
from broker.store import attempts as att
from broker.store.queries import list_jobs
from broker.wiring.runtime import build_backends, control_params
from tests.harness.server import (
    job_spec,
    k8s_backend,
    k8s_pools,
    slurm_backend,
    slurm_pools,
    write_config,
)
from tests.harness.wait import wait_until

STRESS_S = float(os.environ.get("ISTHMUS_STRESS_S", "30"))
LIVE = ["SUBMITTED", "VALIDATING", "QUEUED", "ADMITTED", "PREPARING", "RUNNING", "RETRYING"]


def _plane(tmp_path: Path, backends: list[dict[str, Any]],
           pools: list[dict[str, Any]]) -> ControlPlane:
    config = load_config(write_config(tmp_path / "isthmus.yaml", backends, pools))
    db = open_database(f"sqlite:///{tmp_path / 'isthmus.db'}", sqlite_synchronous="NORMAL")
    return ControlPlane(db, config, build_backends(config), params=control_params(config))


def _consistent(db: Database) -> None:
    with db.read() as s:
        assert list(check_all(s)) == []
        assert ledger.check(s) == []
        holding = list_jobs(s, states=["ADMITTED", "PREPARING", "RUNNING"], limit=10_000)
        reserved = sum(g for g, _ in ledger.usage(s).values())
        assert reserved == sum(j.total_gpus for j in holding)


def _stress(plane: ControlPlane, backend: str, kind: str, seconds: float) -> dict[str, int]:
    """Run the control passes and a client in threads for `seconds`; return counts."""
    stop = threading.Event()
    errors: list[str] = []
    passes = dict.fromkeys(("admission", "dispatch", "reconcile", "client"), 0)
    submitted: list[str] = []
    names = itertools.count()

    def client() -> None:  # keeps about a dozen jobs alive, cancels every fifth one
        with plane.db.read() as s:
            alive = len(list_jobs(s, states=LIVE, limit=1000))
        if alive < 12:
            i = next(names)
            data = job_spec(f"stress-{i}", ["a100-80g", "h100-80g"][i % 2], backend=kind,
                            command=["sleep", "2"])
            job = submit_job(plane.db, plane.config, JobSpec.model_validate(data), "stress").job
            submitted.append(job.id)
            if i % 5 == 4 and len(submitted) > 2:
                cancel_job(plane.db, submitted[-3], "stress", by_admin=False)

    def loop(name: str, fn: Callable[[], object], pause: float) -> None:
        while not stop.is_set():
            try:
                fn()
                passes[name] += 1
            except Exception:
                errors.append(f"{name}: {traceback.format_exc()}")
                stop.set()
            stop.wait(pause)

    threads = [
        threading.Thread(target=loop, args=("admission", lambda: run_admission(plane), 0.3)),
        threading.Thread(target=loop, args=("dispatch", lambda: run_dispatch(plane), 0.2)),
        threading.Thread(target=loop, args=("reconcile", lambda: run_reconcile(plane, backend),
                                            0.3)),
        threading.Thread(target=loop, args=("client", client, 0.2)),
    ]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a control pass did not return"
    assert errors == [], "\n".join(errors)
    return {**passes, "submitted": len(submitted)}


def _wind_down(plane: ControlPlane, backend: str) -> None:
    """Cancel what is left and let the reconciler remove its backend objects (only ours:
    other tests may share the cluster). Best effort: a shared cluster may be restarted by
    another test meanwhile, and the jobs end by themselves anyway (`sleep 2`)."""
    with plane.db.read() as s:
        left = [j.id for j in list_jobs(s, states=LIVE, limit=1000)]
    for job_id in left:
        cancel_job(plane.db, job_id, "stress", by_admin=False)

    def settled() -> bool:
        run_dispatch(plane)
        run_reconcile(plane, backend)
        with plane.db.read() as s:
            return not att.live(s, backend)

    with contextlib.suppress(AssertionError):
        wait_until(settled, 20, "every attempt ended", interval=0.5)


@pytest.fixture
def slurm_plane(slurm_cluster: Any, tmp_path: Path, workdir: Path) -> Iterator[ControlPlane]:
    plane = _plane(tmp_path, [slurm_backend(slurm_cluster, workdir)], slurm_pools())
    yield plane
    plane.db.dispose()


@pytest.fixture
def k8s_plane(k8s_cluster: Any, tmp_path: Path) -> Iterator[ControlPlane]:
    namespace = k8s_cluster.create_namespace("isthmus-stress")
    plane = _plane(tmp_path, [k8s_backend(k8s_cluster, namespace)], k8s_pools())
    yield plane
    plane.db.dispose()
    close = getattr(plane.backends["k8s-local"], "close", None)
    if close is not None:
        close()
    k8s_cluster.delete_namespace(namespace)


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_concurrent_control_passes_on_real_slurm(slurm_plane: ControlPlane) -> None:
    started = time.monotonic()
    counts = _stress(slurm_plane, "slurm-local", "slurm", STRESS_S)
    print(f"slurm stress: {time.monotonic() - started:.1f}s, {counts}")
    assert counts["submitted"] > 5 and counts["dispatch"] > 10 and counts["reconcile"] > 10
    _consistent(slurm_plane.db)
    _wind_down(slurm_plane, "slurm-local")
    _consistent(slurm_plane.db)


@pytest.mark.k8s
@pytest.mark.timeout(240)
def test_concurrent_control_passes_on_real_kubernetes(k8s_plane: ControlPlane) -> None:
    started = time.monotonic()
    counts = _stress(k8s_plane, "k8s-local", "k8s", STRESS_S)
    print(f"k8s stress: {time.monotonic() - started:.1f}s, {counts}")
    assert counts["submitted"] > 5 and counts["dispatch"] > 10 and counts["reconcile"] > 10
    _consistent(k8s_plane.db)
    _wind_down(k8s_plane, "k8s-local")
    _consistent(k8s_plane.db)
