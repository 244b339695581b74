"""On the real local control plane, with the control loop: a gang runs to completion, the
reconciler records its end, and the backend then forgets it (its Job and pods leave the watch
caches, backends/k8s/forget.py), while its logs are still read, in per-team namespaces (where
healthy caches alone would not find it any more)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends.k8s import K8sBackend
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlParams, ControlPlane
from broker.control.reconcile import run_reconcile
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store.db import Database
from broker.store.queries import get_job
from broker.wiring.adapters import k8s_adapter
from tests.builders import spec
from tests.fixtures.k8s import FAKE_DURATION, K8sCluster
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
TEAM = "vision"


@pytest.fixture
def plane(k8s_cluster: K8sCluster, db: Database) -> Iterator[ControlPlane]:
    """A control plane over the local cluster's pool a100, each team in a namespace of its
    own (unique to this run), finished gangs forgotten at once."""
    template = f"isthmus-{uuid.uuid4().hex[:6]}-{{team}}"
    config = parse_config({
        "auth": {"mode": "none"},
        "flavors": [{"name": "h100-80g", "gpu_model": "NVIDIA-H100-80GB-HBM3",
                     "gpu_memory_gb": 80}],
        "backends": [{"name": "k8s-local", "kind": "k8s", "settings": {
            "kubeconfig": str(k8s_cluster.kubeconfig), "namespace": template,
            "all_ranks_timeout_s": 30, "forget_finished_after_s": 0,
            "pod_annotations": {FAKE_DURATION: "2s"}}}],
        "pools": [{"name": "a100", "backend": "k8s-local", "flavor": "h100-80g",
                   "node_selector": {"isthmus.io/pool": "a100"}}],
        "cohorts": [{"name": "research"}],
        "teams": [{"name": TEAM, "cohort": "research", "quotas": {"h100-80g": {"nominal": 16}}}],
    }, "test")
    backend = k8s_adapter(config.backends[0], list(config.pools))
    p = ControlPlane(db, config, {"k8s-local": backend}, params=ControlParams(lost_grace_s=5))
    try:
        yield p
    finally:
        backend.close()
        with contextlib.suppress(Exception):
            k8s_cluster.delete_namespace(template.replace("{team}", TEAM))


def _cycle(plane: ControlPlane) -> None:
    run_admission(plane)
    run_dispatch(plane)
    run_reconcile(plane, "k8s-local")


def _state(plane: ControlPlane, job_id: str) -> str:
    with plane.db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        return str(job.state)


def _cached(backend: K8sBackend, kind: str, name: str) -> list[Any]:
    return [o for o in backend.reflectors[kind].snapshot()
            if name in (o["metadata"]["name"], o["metadata"]["labels"].get("isthmus.io/name"))]


def test_a_recorded_gang_is_forgotten_and_its_logs_still_read(plane: ControlPlane) -> None:
    job_id = submit_job(plane.db, plane.config, spec().team(TEAM).flavors("h100-80g")
                        .replicas(2).gpus(1).backend("k8s").build(), "tester").job.id

    def ended() -> bool:
        _cycle(plane)
        return _state(plane, job_id) == "SUCCEEDED"

    wait_until(ended, 120, "the gang to succeed and the reconciler to record it", interval=0.5)
    with plane.db.read() as s:
        (attempt,) = att.attempts_of(s, job_id)
    name = attempt.backend_name
    assert attempt.ended_at is not None
    backend = getattr(plane.backends["k8s-local"], "inner", None)  # behind the plane's gate
    assert isinstance(backend, K8sBackend)
    wait_until(lambda: backend.reflectors["jobs"].healthy
               and backend.reflectors["pods"].healthy, 30, "the watches to be healthy")
    assert _cached(backend, "jobs", name)  # recorded, not forgotten yet

    def forgotten() -> bool:  # no longer asked about: forgotten by the next pass (again, if
        run_reconcile(plane, "k8s-local")  # a late pod event showed it since)
        return _cached(backend, "jobs", name) == _cached(backend, "pods", name) == []

    wait_until(forgotten, 30, "the backend to forget the gang", interval=0.5)
    logs = backend.logs(name, tail=5)
    assert [x.rank for x in logs] == [0, 1], logs
    assert all("pod isthmus-" in x.source and name in x.source for x in logs), logs
    found = backend.lookup(name)
    assert found is not None and found.phase.value == "SUCCEEDED"
    assert _state(plane, job_id) == "SUCCEEDED"
