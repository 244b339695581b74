"""`deploy/testenv/k8s/up --with-kueue`: a real Kueue on the local control plane, configured
like examples/isthmus-local.yaml's Kubernetes pools (deploy/testenv/k8s/kueue/queues.yaml)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.k8s import (
    FAKE_DURATION,
    RACK_LABEL,
    K8sCluster,
    as_dict,
    kueue_env,
    run_up,
)
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def test_up_with_kueue_again_reuses_its_cluster(k8s_kueue_cluster: K8sCluster) -> None:
    proc, _ = run_up(timeout=120, kueue=True)
    assert proc.returncode == 0, proc.stderr
    assert "reusing running cluster" in proc.stderr
    assert "K8S_KUEUE_VERSION=v0.17.0" in proc.stdout
    # its own cluster: never the default one (whose config hash says kueue=0)
    assert str(k8s_kueue_cluster.state_dir) == kueue_env()["ISTHMUS_K8S_STATE"]


def test_queues_are_shaped_like_the_example_pools(k8s_kueue_cluster: K8sCluster) -> None:
    with k8s_kueue_cluster.api_client() as api:
        custom: Any = client.CustomObjectsApi(api)
        topo = custom.get_cluster_custom_object(*KUEUE, "topologies", "isthmus-topology")
        assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == [
            "topology.isthmus.io/block", RACK_LABEL, "kubernetes.io/hostname"]
        a100 = custom.get_cluster_custom_object(*KUEUE, "resourceflavors", "a100-80g")
        assert a100["spec"]["nodeLabels"] == {"isthmus.io/pool": "a100"}
        cqs = {cq["metadata"]["name"]: cq for cq in
               custom.list_cluster_custom_object(*KUEUE, "clusterqueues")["items"]}
        vision = cqs["vision"]["spec"]
        assert vision["cohortName"] == "research"
        quotas = {f["name"]: f["resources"][0] for f in vision["resourceGroups"][0]["flavors"]}
        assert quotas["h100-80g"]["nominalQuota"] in (64, "64")
        assert quotas["h100-80g"]["lendingLimit"] in (32, "32")


def test_rack_gang_sent_to_kueue_is_admitted_into_one_rack(
        k8s_kueue_cluster: K8sCluster) -> None:
    ns, name = "isthmus-vision", f"kueue-rack-{uuid.uuid4().hex[:6]}"
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "isthmus"}},
        "spec": {
            "suspend": True, "completions": 2, "parallelism": 2, "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {
                    FAKE_DURATION: "2s",
                    "kueue.x-k8s.io/podset-required-topology": RACK_LABEL}},
                "spec": {"restartPolicy": "Never",
                         "nodeSelector": {"isthmus.io/pool": "a100"},
                         "containers": [{"name": "c", "image": "registry.local/x:1",
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            },
        },
    }
    with k8s_kueue_cluster.api_client() as api:
        core: Any = client.CoreV1Api(api)
        batch: Any = client.BatchV1Api(api)
        batch.create_namespaced_job(ns, job)
        try:
            def done() -> dict[str, Any] | None:
                j = as_dict(batch.read_namespaced_job(name, ns))
                conds = (j.get("status") or {}).get("conditions") or []
                return j if any(c["type"] == "Complete" and c["status"] == "True"
                                for c in conds) else None

            wait_until(done, timeout=120, what=f"Kueue to admit {name} and the pods to end")
            pods = as_dict(core.list_namespaced_pod(ns, label_selector=f"job-name={name}"))
            nodes = {p["spec"]["nodeName"] for p in pods["items"]}
            racks = {core.read_node(n).metadata.labels[RACK_LABEL] for n in nodes}
            assert len(nodes) == 2 and len(racks) == 1, (nodes, racks)
        finally:
            batch.delete_namespaced_job(name, ns, propagation_policy="Background")
