"""Isthmus in ``kueue`` mode on the real local control plane with a real Kueue (v0.17.0, from
``deploy/testenv/k8s/up --with-kueue``): a job Kueue holds for lack of quota says so with
Kueue's own words, is admitted when quota frees and runs to the end; a job Kueue preempts is
torn down and retried by Isthmus.

Each test makes its own ClusterQueue (8 a100 GPUs, no cohort) and LocalQueue in a fresh
namespace, so nothing else on the cluster can change what Kueue decides."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness.server import FAKE, Server, job_spec, k8s_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "isthmus"


@dataclass(frozen=True)
class Queues:
    namespace: str
    cluster_queue: str
    priority_class: str


def _create(custom: Any, plural: str, body: dict[str, Any], ns: str | None = None) -> None:
    if ns is None:
        custom.create_cluster_custom_object(*KUEUE, plural, body)
    else:
        custom.create_namespaced_custom_object(*KUEUE, ns, plural, body)


@pytest.fixture
def queues(k8s_kueue_cluster: Any) -> Iterator[Queues]:
    """A namespace whose LocalQueue `isthmus` feeds a ClusterQueue of 8 a100 GPUs."""
    from kubernetes import client

    tag = uuid.uuid4().hex[:8]
    ns = k8s_kueue_cluster.create_namespace("isthmus-kq")
    cq, high = f"kq-{tag}", f"kq-high-{tag}"
    api = k8s_kueue_cluster.api_client()
    custom = client.CustomObjectsApi(api)
    _create(custom, "clusterqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                     {"name": "a100-80g",
                      "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}})
    _create(custom, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": ns}, "spec": {"clusterQueue": cq}}, ns)
    _create(custom, "workloadpriorityclasses", {
        "apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass",
        "metadata": {"name": high}, "value": 1000})

    def active() -> bool:
        obj: Any = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", cq)
        return any(c.get("type") == "Active" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or ())

    wait_until(active, 60, f"ClusterQueue {cq} Active")
    try:
        yield Queues(ns, cq, high)
    finally:
        k8s_kueue_cluster.delete_namespace(ns)
        for plural, name in (("clusterqueues", cq), ("workloadpriorityclasses", high)):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*KUEUE, plural, name)
        api.close()


def _server(cluster: Any, q: Queues, tmp_path: Path, duration: str | None) -> Server:
    """Without ``duration`` each job says its own (``_lasting``)."""
    settings: dict[str, Any] = {
        "kubeconfig": str(cluster.kubeconfig), "namespace": q.namespace,
        "modes": {"k8s-a100": "kueue"}, "kueue_queues": {"k8s-a100": QUEUE}}
    if duration:
        settings["pod_annotations"] = {f"{FAKE}duration": duration}
    backend = {"name": "k8s-local", "kind": "k8s", "settings": settings}
    cfg = write_config(tmp_path / "isthmus.yaml", [backend], k8s_pools())
    return Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()


def _lasting(name: str, duration: str) -> dict[str, Any]:
    """An a100 gang whose fake pods run for ``duration`` (a Go duration, or "never")."""
    spec = job_spec(name, "a100-80g", backend="k8s")
    spec["annotations"] = {f"{FAKE}duration": duration}
    return spec


def _state(server: Server, job_id: str, *states: str) -> dict[str, Any] | None:
    job = server.job(job_id)
    return job if job["state"] in states else None


def test_held_by_kueue_for_quota_then_admitted_runs_and_succeeds(
        k8s_kueue_cluster: Any, queues: Queues, tmp_path: Path) -> None:
    # the first gang holds the quota until the test has seen Kueue's verdict on the second (a
    # fixed run time left a window a busy machine could miss), then is cancelled to free it
    server = _server(k8s_kueue_cluster, queues, tmp_path, None)
    try:
        first = server.submit(_lasting("kq-first", "never"))["id"]
        wait_until(lambda: _state(server, first, "RUNNING"), 120, "the first job running")
        second = server.submit(_lasting("kq-second", "5s"))["id"]

        def held() -> dict[str, Any] | None:
            # HeldByKueue comes first as "not evaluated yet" (true until Kueue's scheduler
            # has looked at the Workload); wait for Kueue's own verdict
            job = server.job(second)
            return job if job["reason"] == "HeldByKueue" \
                and "QuotaReserved=False" in job["message"] else None

        try:
            job = wait_until(held, 90, "the second job held by Kueue, in Kueue's words")
        except AssertionError as e:
            # say what was seen instead (CI caught this once without a clue: stop 39)
            raise AssertionError(
                f"{e}\nsecond: {server.job(second)}\nits events: {server_events(server, second)}"
                f"\nfirst: {server.job(first)}\nworkloads: "
                f"{_workload_conditions(k8s_kueue_cluster, queues)}") from None
        # Isthmus admitted and dispatched it; Kueue holds it, and Isthmus says why in
        # Kueue's own words
        assert job["state"] == "PREPARING", job
        assert "insufficient unused quota for nvidia.com/gpu in flavor a100-80g" \
            in job["message"], job
        assert _state(server, first, "RUNNING"), "the first job still runs meanwhile"
        _backend_agrees(k8s_kueue_cluster, queues, f"isthmus-{second}-1")

        r = httpx.post(f"{server.url}/v1/jobs/{first}/cancel", timeout=30)
        assert r.status_code == 200, r.text
        wait_until(lambda: _state(server, first, "CANCELLED"), 180, "the first job to end")
        wait_until(lambda: _state(server, second, "RUNNING", "SUCCEEDED"), 120,
                   "Kueue to admit the second job once the quota is free")
        wait_until(lambda: _state(server, second, "SUCCEEDED"), 180, "the second job to end")
        events = server_events(server, second)
        held_at = [e["seq"] for e in events if e["reason"] == "HeldByKueue"]
        running_at = [e["seq"] for e in events if e["to_state"] == "RUNNING"]
        assert held_at and running_at and held_at[0] < running_at[0], events
        assert server.job(second)["attempt"] == 1
    finally:
        server.stop()


def test_preempted_by_kueue_is_torn_down_and_retried(
        k8s_kueue_cluster: Any, queues: Queues, tmp_path: Path) -> None:
    # 30 s: the preemption must come while the first attempt runs, even on a busy machine
    server = _server(k8s_kueue_cluster, queues, tmp_path, "30s")
    try:
        job_id = server.submit(job_spec("kq-victim", "a100-80g", backend="k8s"))["id"]
        wait_until(lambda: _state(server, job_id, "RUNNING"), 120, "the job running")
        first_job = f"isthmus-{job_id}-1"
        # a higher-priority gang sent straight to the same LocalQueue takes the quota
        k8s_kueue_cluster.batch().create_namespaced_job(queues.namespace, {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "kq-high", "labels": {
                "kueue.x-k8s.io/queue-name": QUEUE,
                "kueue.x-k8s.io/priority-class": queues.priority_class}},
            "spec": {"suspend": True, "completions": 1, "parallelism": 1, "backoffLimit": 0,
                     "template": {
                         "metadata": {"annotations": {f"{FAKE}duration": "5s"}},
                         "spec": {"restartPolicy": "Never",
                                  "nodeSelector": {"isthmus.io/pool": "a100"},
                                  "containers": [{
                                      "name": "c", "image": "registry.local/x:1",
                                      "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})

        def preempted() -> list[dict[str, Any]]:
            return [e for e in server_events(server, job_id)
                    if e["reason"] == "Preempted" and e["to_state"] == "RETRYING"]

        event = wait_until(preempted, 120, "Isthmus to see the preemption by Kueue")[0]
        assert event["message"].startswith("evicted by Kueue: Preempted=True (InClusterQueue)"), \
            event

        def gone() -> bool:
            try:
                k8s_kueue_cluster.batch().read_namespaced_job(first_job, queues.namespace)
            except ApiException as exc:
                return exc.status == 404
            return False

        # torn down: Kueue must not re-admit the preempted attempt behind Isthmus's back
        wait_until(gone, 120, f"the preempted attempt's Job {first_job} deleted")
        wait_until(lambda: _state(server, job_id, "SUCCEEDED"), 300,
                   "the retried attempt to run once the high-priority gang is done")
        assert server.job(job_id)["attempt"] == 2
    finally:
        server.stop()


def test_per_team_namespaces_with_the_testenv_queues(
        k8s_kueue_cluster: Any, tmp_path: Path) -> None:
    """Isthmus with `namespace: isthmus-{team}` sends a team's gangs to the LocalQueue of the
    team's namespace (deploy/testenv/k8s/kueue/queues.yaml); a rack gang on the tainted h100
    pool is placed by Kueue's topology-aware scheduling inside one rack and succeeds."""
    backend = {"name": "k8s-local", "kind": "k8s", "settings": {
        "kubeconfig": str(k8s_kueue_cluster.kubeconfig), "namespace": "isthmus-{team}",
        "modes": {"k8s-a100": "kueue", "k8s-h100": "kueue"},
        "kueue_queues": {"k8s-a100": QUEUE, "k8s-h100": QUEUE},
        "pod_annotations": {f"{FAKE}duration": "3s"}}}
    cfg = write_config(tmp_path / "isthmus.yaml", [backend], k8s_pools())
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        job_id = server.submit(job_spec("kq-team", "h100-80g", replicas=2, backend="k8s",
                                        topology="rack"))["id"]
        wait_until(lambda: _state(server, job_id, "SUCCEEDED"), 240, "the rack gang to end")
        core = k8s_kueue_cluster.core()
        pods = core.list_namespaced_pod("isthmus-vision",
                                        label_selector=f"isthmus.io/job={job_id}").items
        racks = {core.read_node(p.spec.node_name).metadata.labels["topology.isthmus.io/rack"]
                 for p in pods}
        assert len(pods) == 2 and len(racks) == 1 and racks <= {"h100-rack-0", "h100-rack-1"}
        # admitted by Kueue, through the team's ClusterQueue
        from kubernetes import client

        with k8s_kueue_cluster.api_client() as api:
            custom: Any = client.CustomObjectsApi(api)
            wls = custom.list_namespaced_custom_object(
                *KUEUE, "isthmus-vision", "workloads")["items"]
        (wl,) = [w for w in wls if any(r.get("name") == f"isthmus-{job_id}-1"
                                       for r in w["metadata"].get("ownerReferences") or ())]
        assert wl["status"]["admission"]["clusterQueue"] == "vision", wl["status"]
    finally:
        server.stop()


def _workload_conditions(cluster: Any, q: Queues) -> dict[str, Any]:
    """Each Workload in the test's namespace: its conditions, as Kueue wrote them."""
    from kubernetes import client

    with cluster.api_client() as api:
        listed: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
            *KUEUE, q.namespace, "workloads")
    return {w["metadata"]["name"]: [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in (w.get("status") or {}).get("conditions") or ()]
        for w in listed.get("items") or ()}


def _backend_agrees(cluster: Any, q: Queues, name: str) -> None:
    """The backend's direct read (lookup: the Workload by the Job's uid) and its listing
    without watches say the same as the server's watch caches."""
    from backends.k8s.adapter import K8sBackend
    from backends.k8s.settings import K8sPoolBinding, K8sSettings
    from broker.domain.reasons import Reason

    settings = K8sSettings.from_dict({"kubeconfig": str(cluster.kubeconfig),
                                      "namespace": q.namespace, "modes": {"k8s-a100": "kueue"},
                                      "kueue_queues": {"k8s-a100": QUEUE}})
    pool = K8sPoolBinding("k8s-a100", "a100-80g", {"isthmus.io/pool": "a100"})
    backend = K8sBackend("k8s-local", [pool], settings, watch=False)
    try:
        fact = backend.lookup(name)
        assert fact is not None and fact.reason is Reason.HeldByKueue, fact
        assert "QuotaReserved=False" in fact.message, fact
        listed = {f.backend_name: f for f in backend.observe()}
        assert listed[name].reason is Reason.HeldByKueue, listed
    finally:
        backend.close()


def server_events(server: Server, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/events", timeout=30)
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()
    return events
