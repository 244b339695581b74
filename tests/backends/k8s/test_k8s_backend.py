"""The Kubernetes backend against the real local control plane (deploy/testenv/k8s).

Each test works in its own namespace. Tests that need particular capacity (foreign pods,
cordoned or lost nodes) bring their own fake GPU nodes in a pool of their own, tainted so that
nobody else's pods land there, and delete them afterwards: the shared 16 nodes are never
changed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from backends.base import Unsupported
from backends.k8s.manifests import LABEL_NAME, MANAGED_SELECTOR
from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import PoolSnapshot
from broker.domain.reasons import Reason
from tests.fixtures.k8s import (
    FAKE_DURATION,
    FAKE_EXIT_CODE,
    FAKE_REASON,
    RACK_LABEL,
    as_dict,
)
from tests.harness.k8s_backend import MakeBackend, wait_fact
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import foreign_pod, gpu_node, new_job_id
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


TempPool = Callable[..., str]


@pytest.fixture
def temp_pool(api: client.ApiClient) -> Iterator[TempPool]:
    """Creates a pool of its own fake GPU nodes: temp_pool(specs) -> pool name, where each
    spec is a dict of gpu_node keyword arguments plus 'rack'."""
    core = client.CoreV1Api(api)
    names: list[str] = []

    def make(*specs: dict[str, Any]) -> str:
        pool = f"t{uuid.uuid4().hex[:6]}"
        for i, spec in enumerate(specs):
            spec = dict(spec)
            rack = spec.pop("rack", f"{pool}-rack-0")
            node = gpu_node(f"gpu-{pool}-{i:02d}", pool, rack, **spec)
            core.create_node(node)  # type: ignore[arg-type]
            names.append(node["metadata"]["name"])
        kwok = [n for n, s in zip(names[-len(specs):], specs, strict=True)
                if s.get("kwok", True)]

        def ready() -> bool:
            for name in kwok:  # Ready, and the lifecycle controller lifted its taints
                node = as_dict(core.read_node(name))
                conds = node["status"].get("conditions") or []
                if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return False
                taints = node["spec"].get("taints") or []
                if any(t["key"] in NOT_READY_TAINTS for t in taints):
                    return False
            return True

        wait_until(ready, timeout=30, what=f"nodes of {pool} Ready")
        return pool

    yield make
    for name in names:
        try:
            core.delete_node(name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def job_pods(core: client.CoreV1Api, ns: str, name: str) -> list[dict[str, Any]]:
    return list(as_dict(core.list_namespaced_pod(ns, label_selector=f"{LABEL_NAME}={name}"))
                ["items"])


def free_rack(pool: PoolSnapshot, replicas: int, gpus: int) -> str | None:
    """A rack (as 'block/rack') of the pool with `replicas` nodes that have `gpus` free."""
    racks: dict[str, int] = {}
    for n in pool.nodes:
        if n.schedulable and n.free_gpus >= gpus:
            dom = n.topology.domain("rack", n.name)
            racks[dom] = racks.get(dom, 0) + 1
    return next((r for r, count in sorted(racks.items()) if count >= replicas), None)


def fits(pool: PoolSnapshot, replicas: int, gpus: int) -> bool:
    return sum(n.free_gpus // gpus for n in pool.nodes if n.schedulable) >= replicas


# -- gangs ----------------------------------------------------------------------------------


def test_gang_4x8_lands_in_one_rack_of_its_pool_and_succeeds(
    make_backend: MakeBackend, api: client.ApiClient, k8s_namespace: str
) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "3s"})
    h100 = backend.inventory().pool("h100")
    assert h100 is not None and h100.backend_kind == "k8s" and h100.total_gpus >= 64
    rack = free_rack(h100, 4, 8)
    assert rack, f"no h100 rack with 4 free nodes: {h100.nodes}"
    job_id = new_job_id()
    req = request(pool="h100", level="rack", domain=rack, replicas=4, gpus=8, job_id=job_id)
    result = backend.submit(req)
    assert not result.adopted and result.backend_id

    fact = wait_fact(backend, req.name, lambda f: f.phase is Phase.SUCCEEDED)
    assert fact.reason is Reason.Succeeded and fact.exit_code == 0
    assert (fact.job_id, fact.attempt, fact.backend_id) == (job_id, 2, result.backend_id)
    assert fact.started_at and fact.ended_at and fact.submitted_at
    assert len(fact.nodes) == 4

    core = client.CoreV1Api(api)
    pods = job_pods(core, k8s_namespace, req.name)
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert nodes == set(fact.nodes) and len(nodes) == 4
    racks = {as_dict(core.read_node(n))["metadata"]["labels"][RACK_LABEL] for n in nodes}
    assert racks == {rack.split("/")[-1]}
    # ranks find each other through the headless Service
    svc = as_dict(core.read_namespaced_service(req.name, k8s_namespace))
    assert svc["spec"]["clusterIP"] == "None"
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"{req.name}-0.{req.name}" and env["WORLD_SIZE"] == "4"
    assert {p["spec"]["hostname"] for p in pods} == {f"{req.name}-{i}" for i in range(4)}


def test_oom_is_a_user_error(make_backend: MakeBackend) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "2s", FAKE_EXIT_CODE: "137",
                                            FAKE_REASON: "OOMKilled"})
    req = request(pool="a100", replicas=2, gpus=1, job_id=new_job_id())
    backend.submit(req)
    fact = wait_fact(backend, req.name, lambda f: f.phase is Phase.FAILED)
    assert fact.failure is FailureCategory.USER_ERROR and fact.reason is Reason.UserError
    assert (fact.raw_reason, fact.exit_code) == ("OOMKilled", 137)


def test_submit_after_a_crash_adopts_instead_of_duplicating(
    make_backend: MakeBackend, api: client.ApiClient, k8s_namespace: str
) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "never"})
    req = request(pool="a100", replicas=1, gpus=1, job_id=new_job_id())
    job = backend.render(req)[0]  # Job, Service, Secret
    # the previous broker created the Job and died before the Service
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    made = as_dict(batch.create_namespaced_job(k8s_namespace, job))  # type: ignore[arg-type]
    found = backend.lookup(req.name)
    assert found is not None and found.backend_id == made["metadata"]["uid"]
    result = backend.submit(req)
    assert result.adopted and result.backend_id == made["metadata"]["uid"]
    again = backend.submit(req)
    assert again.adopted and again.backend_id == result.backend_id
    jobs = as_dict(batch.list_namespaced_job(k8s_namespace, label_selector=MANAGED_SELECTOR))
    assert [j["metadata"]["name"] for j in jobs["items"]] == [req.name]
    svc = as_dict(core.read_namespaced_service(req.name, k8s_namespace))
    assert svc["metadata"]["ownerReferences"][0]["uid"] == result.backend_id
    # a stranger's object with the same name is never adopted
    other = request(pool="a100", replicas=1, gpus=1, job_id=new_job_id())
    stranger = other.__class__(job_id=other.job_id, attempt=other.attempt, name=req.name,
                               snapshot=other.snapshot, placement=other.placement)
    with pytest.raises(Unsupported, match="already exists"):
        backend.submit(stranger)


def test_cancel_deletes_the_gang_with_grace(
    make_backend: MakeBackend, api: client.ApiClient, k8s_namespace: str
) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "never"})
    req = request(pool="a100", replicas=2, gpus=1, job_id=new_job_id())
    backend.submit(req)
    wait_fact(backend, req.name, lambda f: f.phase is Phase.RUNNING)
    result = backend.cancel(req.name, 5)
    assert result.found and result.signalled, result
    core = client.CoreV1Api(api)
    wait_until(lambda: not job_pods(core, k8s_namespace, req.name), timeout=60,
               what="the gang's pods to be gone")
    wait_until(lambda: all(f.backend_name != req.name for f in backend.observe()), timeout=30,
               what="the Job to be gone")
    assert not backend.cancel(req.name, 5).found


# -- inventory ------------------------------------------------------------------------------


def test_inventory_counts_foreign_pods_and_unusable_nodes(
    make_backend: MakeBackend, temp_pool: TempPool, api: client.ApiClient, k8s_namespace: str
) -> None:
    pool = temp_pool(
        {"rack": "r0"}, {"rack": "r0"}, {"rack": "r1"},  # 00 full, 01 partly used, 02 free
        {"rack": "r1", "unschedulable": True},  # 03 cordoned
        {"rack": "r1", "kwok": False},  # 04 never Ready
        {"rack": "r1", "taints": [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]},
    )
    core = client.CoreV1Api(api)
    n = [f"gpu-{pool}-{i:02d}" for i in range(6)]
    part = foreign_pod("part", gpus=3, pool=pool, node=n[1])
    part["spec"]["activeDeadlineSeconds"] = 3600  # a declared limit: its GPUs' release time
    for pod in (foreign_pod("full", gpus=8, pool=pool, node=n[0]),
                part,
                foreign_pod("done", gpus=8, pool=pool, node=n[2],
                            annotations={FAKE_DURATION: "0s"}),
                foreign_pod("waits", gpus=16, pool=pool),  # never fits: pending demand
                foreign_pod("isthmus-waits", gpus=16, pool=pool,
                            labels={"isthmus.io/managed-by": "isthmus", LABEL_NAME: "x"}),
                foreign_pod("elsewhere", gpus=16, pool="h100")):
        core.create_namespaced_pod(k8s_namespace, pod)  # type: ignore[arg-type]

    def settled() -> bool:
        pods = as_dict(core.list_namespaced_pod(k8s_namespace))["items"]
        phase = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
        return (phase.get("full") == phase.get("part") == "Running"
                and phase.get("done") == "Succeeded")

    wait_until(settled, timeout=60, what="foreign pods running / done")
    backend = make_backend(pools=(pool, "h100"))
    snap = backend.inventory().pool(pool)
    assert snap is not None
    nodes = {x.name: x for x in snap.nodes}
    assert [nodes[x].free_gpus for x in n[:3]] == [0, 5, 8]
    assert all(nodes[x].schedulable for x in n[:3])
    assert nodes[n[3]].reason == "cordoned"
    assert nodes[n[4]].reason == "NotReady"
    assert nodes[n[5]].reason == "tainted maintenance=x:NoSchedule"
    assert not any(nodes[x].schedulable for x in n[3:])
    assert snap.total_gpus == 48 and snap.free_gpus == 13
    assert nodes[n[2]].topology.rack == "r1" and nodes[n[2]].topology.block == f"{pool}-block-0"
    assert snap.queue.foreign_pending_gpus == 16
    assert (snap.queue.isthmus_pending_gpus, snap.queue.isthmus_pending_jobs) == (16, 1)
    # A 2x8 gang does not fit: it stays in Isthmus (submit is never called); 1x8 would.
    assert not fits(snap, 2, 8) and fits(snap, 1, 8) and fits(snap, 2, 4)
    # releases: start + declared limit where there is one, nothing where there is none
    started = next(p for p in as_dict(core.list_namespaced_pod(k8s_namespace))["items"]
                   if p["metadata"]["name"] == "part")["status"]["startTime"]
    start = datetime.fromisoformat(started.replace("Z", "+00:00"))
    assert nodes[n[1]].releases == ((start + timedelta(seconds=3600), 3),)
    assert nodes[n[0]].releases == ()


def test_foreign_pods_racing_for_capacity_trip_the_all_ranks_timeout(
    make_backend: MakeBackend, temp_pool: TempPool, api: client.ApiClient, k8s_namespace: str
) -> None:
    pool = temp_pool(*[{"rack": "r0"}] * 4)
    backend = make_backend(pools=(pool,), all_ranks_timeout_s=3,
                           pod_annotations={FAKE_DURATION: "never"})
    snap = backend.inventory().pool(pool)
    assert snap is not None
    assert fits(snap, 4, 8), snap.nodes  # placement saw room for the gang ...
    core = client.CoreV1Api(api)
    for i in range(2):  # ... and then someone else took half of it
        racer = foreign_pod(f"racer-{i}", gpus=8, pool=pool, node=f"gpu-{pool}-{i:02d}")
        core.create_namespaced_pod(k8s_namespace, racer)  # type: ignore[arg-type]
    req = request(pool=pool, replicas=4, gpus=8, job_id=new_job_id())
    backend.submit(req)
    fact = wait_fact(backend, req.name, lambda f: f.phase is Phase.FAILED, timeout=60)
    assert fact.failure is FailureCategory.ORCHESTRATION
    assert (fact.reason, fact.raw_reason) == (Reason.WaitingForAllRanks, "WaitingForAllRanks")
    assert "2 of 4" in fact.message
    wait_until(lambda: not job_pods(core, k8s_namespace, req.name), timeout=60,
               what="the torn-down gang's pods to be gone")
    # the verdict outlives the Job
    later = wait_fact(backend, req.name, lambda f: f.phase is Phase.FAILED)
    assert later.failure is FailureCategory.ORCHESTRATION
    assert later.raw_state == "TornDown"


def test_a_node_lost_mid_run_is_infra_transient(
    make_backend: MakeBackend, temp_pool: TempPool, api: client.ApiClient
) -> None:
    pool = temp_pool({"rack": "r0"}, {"rack": "r0"})
    backend = make_backend(pools=(pool,), pod_annotations={FAKE_DURATION: "never"})
    req = request(pool=pool, replicas=2, gpus=8, job_id=new_job_id())
    backend.submit(req)
    running = wait_fact(backend, req.name, lambda f: f.phase is Phase.RUNNING)
    core = client.CoreV1Api(api)
    core.delete_node(running.nodes[1])  # the machine is gone
    fact = wait_fact(backend, req.name, lambda f: f.phase is Phase.FAILED, timeout=60)
    assert fact.failure is FailureCategory.INFRA_TRANSIENT
    assert fact.raw_reason in ("NodeLost", "DeletionByPodGC"), fact
    assert running.nodes[1] in fact.message or fact.raw_reason == "DeletionByPodGC"
