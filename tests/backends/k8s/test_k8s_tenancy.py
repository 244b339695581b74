"""Tenancy on the real local control plane: the progress token lives in a per-attempt Secret
owned by the Job (never a literal on the Job or its pods), and goes when the gang goes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from backends.k8s import K8sBackend
from broker.config import Backend as BackendConfig
from broker.config import Pool
from broker.domain.facts import Phase
from broker.wiring.adapters import k8s_adapter
from tests.fixtures.k8s import FAKE_DURATION, K8sCluster, as_dict
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import new_job_id
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
TOKEN = "tok-" + "x" * 40


def _backend(k8s_cluster: K8sCluster, namespace: str, *, create: bool) -> K8sBackend:
    """The adapter on pool a100 whose pods never end by themselves, in `namespace` (one
    namespace, or a per-team template with `{team}`)."""
    cfg = BackendConfig(name="k8s-local", kind="k8s", settings={
        "kubeconfig": str(k8s_cluster.kubeconfig), "namespace": namespace,
        "create_namespace": create, "all_ranks_timeout_s": 30,
        "pod_annotations": {FAKE_DURATION: "never"}})
    return k8s_adapter(cfg, [Pool(name="a100", backend="k8s-local", flavor="h100-80g",
                                  node_selector={"isthmus.io/pool": "a100"})])


def _per_team() -> str:
    """A per-team namespace template unique to this run (an earlier run's namespaces may still
    be terminating)."""
    return f"isthmus-{uuid.uuid4().hex[:6]}-{{team}}"


@pytest.fixture
def backend(k8s_cluster: K8sCluster, k8s_namespace: str) -> Iterator[K8sBackend]:
    b = _backend(k8s_cluster, k8s_namespace, create=False)
    try:
        yield b
    finally:
        b.close()


def _secret(core: client.CoreV1Api, name: str, ns: str) -> dict[str, Any] | None:
    try:
        return as_dict(core.read_namespaced_secret(name, ns))
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_progress_token_is_a_secret_owned_by_the_job_and_deleted_with_it(
    backend: K8sBackend, k8s_cluster: K8sCluster, k8s_namespace: str
) -> None:
    req = request(pool="a100", replicas=2, gpus=1, job_id=new_job_id(),
                  env={"ISTHMUS_PROGRESS_TOKEN": TOKEN})
    result = backend.submit(req)
    with k8s_cluster.api_client() as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        job = as_dict(batch.read_namespaced_job(req.name, k8s_namespace))
        assert TOKEN not in json.dumps(job)
        (c,) = job["spec"]["template"]["spec"]["containers"]
        (env,) = [e for e in c["env"] if e["name"] == "ISTHMUS_PROGRESS_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == req.name
        secret = _secret(core, req.name, k8s_namespace)
        assert secret is not None
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Job", result.backend_id)
        assert secret["data"]["progress-token"]  # base64 of the token, readable only here
        running = wait_until(lambda: next((f for f in backend.observe([req.name])
                                           if f.backend_name == req.name
                                           and f.phase is Phase.RUNNING), None),
                             timeout=60, interval=0.3, what="the gang to run")
        # what the run snapshot resolves: the GPU model of the nodes the ranks got
        assert running.gpu_models == ("NVIDIA-A100-SXM4-80GB",)
        pods = core.list_namespaced_pod(k8s_namespace,
                                        label_selector=f"isthmus.io/name={req.name}")
        assert pods.items and TOKEN not in json.dumps(as_dict(pods))
        # a retried submit (after a crash) adopts the Secret like the Job
        assert backend.submit(req).adopted
        assert backend.cancel(req.name, 0).found
        wait_until(lambda: _secret(core, req.name, k8s_namespace) is None, timeout=60,
                   interval=0.3, what="the Secret to go with the Job")


def test_each_team_gets_its_own_namespace(k8s_cluster: K8sCluster) -> None:
    template = _per_team()
    backend = _backend(k8s_cluster, template, create=True)
    made = {team: template.replace("{team}", team) for team in ("vision", "nlp")}
    try:
        reqs = {team: request(pool="a100", replicas=1, gpus=1, job_id=new_job_id(), team=team)
                for team in made}
        for req in reqs.values():
            backend.submit(req)
        with k8s_cluster.api_client() as api:
            core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
            for team, req in reqs.items():
                ns = as_dict(core.read_namespace(made[team]))
                assert ns["metadata"]["labels"]["isthmus.io/team"] == team
                job = as_dict(batch.read_namespaced_job(req.name, made[team]))
                assert job["metadata"]["namespace"] == made[team]
                assert _secret(core, req.name, made[team]) is not None
        # one watch sees both teams' gangs; lookup and cancel find each in its namespace
        wait_until(lambda: {f.backend_name for f in backend.observe()
                            if f.phase is Phase.RUNNING} >= {r.name for r in reqs.values()},
                   timeout=60, interval=0.3, what="both teams' gangs to run")
        for req in reqs.values():
            found = backend.lookup(req.name)
            assert found is not None and found.job_id == req.job_id
            assert backend.cancel(req.name, 0).found
        gone = {r.name for r in reqs.values()}
        wait_until(lambda: not gone & {f.backend_name for f in backend.observe()}, timeout=60,
                   interval=0.3, what="both gangs to be gone")
        assert not backend.cancel(reqs["nlp"].name, 0).found
    finally:
        backend.close()
        for made_ns in made.values():
            k8s_cluster.delete_namespace(made_ns)


def test_lookup_of_a_new_gang_is_answered_by_healthy_watches_without_listing(
    k8s_cluster: K8sCluster,
) -> None:
    """Dispatch looks every new gang up before creating it; with per-team namespaces and both
    watches healthy the caches answer, not two lists across every namespace."""
    template = _per_team()
    backend = _backend(k8s_cluster, template, create=True)
    lists: list[str] = []

    def counted(what: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            lists.append(what)
            return fn(*args, **kwargs)
        return call

    try:
        backend.start()
        wait_until(lambda: all(r.healthy for r in backend.reflectors.values()), timeout=60,
                   interval=0.2, what="the watches to sync")
        apis = backend.apis
        apis.batch.list_job_for_all_namespaces = counted(
            "jobs", apis.batch.list_job_for_all_namespaces)
        apis.core.list_pod_for_all_namespaces = counted(
            "pods", apis.core.list_pod_for_all_namespaces)
        req = request(pool="a100", replicas=1, gpus=1, job_id=new_job_id(), team="vision")
        assert backend.lookup(req.name) is None
        assert lists == []
        backend.submit(req)
        found = wait_until(lambda: backend.lookup(req.name), timeout=60, interval=0.2,
                           what="the new gang in the caches")
        assert found.job_id == req.job_id and lists == []
        # a submit whose lookup missed an object (a watch lagging behind) adopts it on 409
        assert backend.submit(req).adopted
        # while a watch is not healthy the lists answer
        backend.reflectors["pods"].connected = False
        assert backend.lookup(f"{req.name}-other") is None
        assert lists == ["jobs", "pods"]
        assert backend.cancel(req.name, 0).found
    finally:
        backend.close()
        k8s_cluster.delete_namespace(template.replace("{team}", "vision"))
