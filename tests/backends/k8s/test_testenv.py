"""The local Kubernetes test environment (deploy/testenv/k8s) behaves like a GPU cluster.

Real kube-apiserver, controller-manager (Job controller) and scheduler; kwok plays the nodes
and scripts each pod's outcome from its annotations. All through the Python client.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.k8s import (
    BLOCK_LABEL,
    FAKE_DURATION,
    FAKE_EXIT_CODE,
    FAKE_MESSAGE,
    FAKE_REASON,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_PRODUCTS,
    GPU_RESOURCE,
    POOL_LABEL,
    RACK_LABEL,
    TAINTED_POOL,
    K8sCluster,
    as_dict,
    condition,
    run_up,
)
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s


@pytest.fixture
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


def gpu_job(
    name: str,
    *,
    pool: str | None,
    pods: int,
    gpus: int = 8,
    annotations: dict[str, str] | None = None,
    backoff_limit: int = 0,
    pod_failure_policy: client.V1PodFailurePolicy | None = None,
) -> client.V1Job:
    """An Indexed gang Job: ``pods`` pods of ``gpus`` GPUs each, pinned to ``pool`` (with a
    toleration for its taint) unless that is None."""
    tolerations = (
        [client.V1Toleration(key=POOL_LABEL, operator="Equal", value=pool, effect="NoSchedule")]
        if pool
        else None
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            completions=pods,
            parallelism=pods,
            completion_mode="Indexed",
            backoff_limit=backoff_limit,
            pod_failure_policy=pod_failure_policy,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations=annotations or {}),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    node_selector={POOL_LABEL: pool} if pool else None,
                    tolerations=tolerations,
                    containers=[
                        client.V1Container(
                            name="trainer",
                            image="isthmus/fake-trainer:latest",
                            resources=client.V1ResourceRequirements(
                                limits={GPU_RESOURCE: str(gpus)}
                            ),
                        )
                    ],
                ),
            ),
        ),
    )


def job_pods(core: client.CoreV1Api, namespace: str, job: str) -> list[dict[str, Any]]:
    """The Job's pods, as API JSON dicts."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}")
    return list(as_dict(pods)["items"])


def node_labels(core: client.CoreV1Api, name: str) -> dict[str, str]:
    return dict(as_dict(core.read_node(name))["metadata"]["labels"])


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The terminated state of the pod's single container."""
    (status,) = pod["status"]["containerStatuses"]
    return dict(status["state"]["terminated"])


def wait_job_condition(
    batch: client.BatchV1Api, namespace: str, job: str, cond_type: str, timeout: float = 90
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = as_dict(batch.read_namespaced_job_status(job, namespace))
        cond = condition(obj, cond_type)
        return obj if cond is not None and cond["status"] == "True" else None

    return wait_until(probe, timeout=timeout, what=f"Job {namespace}/{job} {cond_type}")


# -- nodes ----------------------------------------------------------------------------------


def test_gpu_nodes_ready_with_capacity_labels_and_taints(
    k8s_cluster: K8sCluster, api: client.ApiClient
) -> None:
    nodes = as_dict(client.CoreV1Api(api).list_node(label_selector="type=kwok"))["items"]
    assert k8s_cluster.pools == ("h100", "a100")
    assert len(nodes) == len(k8s_cluster.pools) * k8s_cluster.nodes_per_pool >= 16

    racks: Counter[tuple[str, str]] = Counter()
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"]["labels"]
        ready = condition(node, "Ready")
        assert ready is not None and ready["status"] == "True", name
        assert node["status"]["capacity"][GPU_RESOURCE] == "8", name
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8", name
        pool = labels[POOL_LABEL]
        assert labels[GPU_PRODUCT_LABEL] == GPU_PRODUCTS[pool], name
        assert int(labels[GPU_MEMORY_LABEL]) >= 80000, name
        assert labels[BLOCK_LABEL] == f"{pool}-block-0", name
        assert labels[RACK_LABEL].startswith(f"{pool}-rack-"), name
        racks[(pool, labels[RACK_LABEL])] += 1
        taints = {(t["key"], t["value"], t["effect"]) for t in node["spec"].get("taints", [])}
        if pool == TAINTED_POOL:
            assert taints == {(POOL_LABEL, pool, "NoSchedule")}, name
        else:
            assert not taints, name
    # 2 racks per pool, nodes split evenly
    assert sorted(racks) == [
        ("a100", "a100-rack-0"),
        ("a100", "a100-rack-1"),
        ("h100", "h100-rack-0"),
        ("h100", "h100-rack-1"),
    ]
    assert set(racks.values()) == {k8s_cluster.nodes_per_pool // 2}


def test_kubectl_lists_nodes_ready_with_gpus(k8s_cluster: K8sCluster) -> None:
    out = k8s_cluster.kubectl(
        [
            "get",
            "nodes",
            "-l",
            "type=kwok",
            "--no-headers",
            "-o",
            "custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu,"
            'READY:.status.conditions[?(@.type=="Ready")].status',
        ]
    ).stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    assert len(rows) == len(k8s_cluster.pools) * k8s_cluster.nodes_per_pool >= 16
    assert all(row[1:] == ["8", "True"] for row in rows), rows
    version = k8s_cluster.kubectl(["version"]).stdout
    assert f"Server Version: {k8s_cluster.version}" in version


def test_up_again_reuses_the_running_cluster(k8s_cluster: K8sCluster) -> None:
    proc, _ = run_up(timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"KUBECONFIG={k8s_cluster.kubeconfig}"
    assert "reusing running cluster" in proc.stderr


# -- jobs -----------------------------------------------------------------------------------


def test_indexed_gang_job_lands_on_distinct_nodes_of_its_pool_and_completes(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    batch.create_namespaced_job(
        k8s_namespace,
        gpu_job("gang", pool="h100", pods=4, annotations={FAKE_DURATION: "4s"}),
    )

    def all_running() -> list[dict[str, Any]] | None:
        pods = job_pods(core, k8s_namespace, "gang")
        if len(pods) == 4 and all(p["status"]["phase"] == "Running" for p in pods):
            return pods
        return None

    pods = wait_until(all_running, timeout=60, what="4 gang pods Running")
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 4, f"8-GPU pods must not share a node: {nodes}"
    for name in nodes:
        labels = node_labels(core, name)
        assert labels[POOL_LABEL] == "h100"
        assert labels[GPU_PRODUCT_LABEL] == GPU_PRODUCTS["h100"]
    indexes = sorted(
        int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]) for p in pods
    )
    assert indexes == [0, 1, 2, 3]

    job = wait_job_condition(batch, k8s_namespace, "gang", "Complete", timeout=60)
    assert job["status"]["succeeded"] == 4
    assert not job["status"].get("failed")
    for pod in job_pods(core, k8s_namespace, "gang"):
        assert pod["status"]["phase"] == "Succeeded"
        assert terminated(pod)["exitCode"] == 0
        assert terminated(pod)["reason"] == "Completed"


def test_untolerated_pods_stay_off_the_tainted_pool(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    """Without a pool selector or toleration, pods only land on the untainted pool."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    job = gpu_job("free", pool=None, pods=3, annotations={FAKE_DURATION: "never"})
    batch.create_namespaced_job(k8s_namespace, job)

    def bound() -> list[dict[str, Any]] | None:
        pods = job_pods(core, k8s_namespace, "free")
        return pods if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_until(bound, timeout=60, what="3 pods bound")
    for pod in pods:
        assert node_labels(core, pod["spec"]["nodeName"])[POOL_LABEL] == "a100"


def test_gang_larger_than_the_pool_leaves_a_pod_pending_insufficient_gpu(
    k8s_cluster: K8sCluster, api: client.ApiClient, k8s_namespace: str
) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    n = k8s_cluster.nodes_per_pool + 1
    batch.create_namespaced_job(
        k8s_namespace, gpu_job("toobig", pool="h100", pods=n, annotations={FAKE_DURATION: "never"})
    )

    def unschedulable() -> dict[str, Any] | None:
        for pod in job_pods(core, k8s_namespace, "toobig"):
            cond = condition(pod, "PodScheduled")
            if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
                return cond
        return None

    cond = wait_until(unschedulable, timeout=60, what="an Unschedulable pod")
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    # stop the job: its running pods are terminated like a kubelet would
    batch.delete_namespaced_job("toobig", k8s_namespace, propagation_policy="Foreground")
    wait_until(
        lambda: not job_pods(core, k8s_namespace, "toobig") or None,
        timeout=60,
        what="the job's pods to be gone",
    )


def test_failing_pod_fails_the_job_with_backoff_limit_exceeded(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    annotations = {
        FAKE_DURATION: "2s",
        FAKE_EXIT_CODE: "3",
        FAKE_REASON: "OOMKilled",
        FAKE_MESSAGE: "CUDA out of memory",
    }
    t0 = time.monotonic()
    batch.create_namespaced_job(
        k8s_namespace, gpu_job("oom", pool="a100", pods=1, annotations=annotations)
    )
    job = wait_job_condition(batch, k8s_namespace, "oom", "Failed", timeout=60)
    elapsed = time.monotonic() - t0
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 1
    assert elapsed >= 2, "the pod must run for its fake-duration before failing"

    (pod,) = job_pods(core, k8s_namespace, "oom")
    assert pod["status"]["phase"] == "Failed"
    assert terminated(pod)["exitCode"] == 3
    assert terminated(pod)["reason"] == "OOMKilled"
    assert terminated(pod)["message"] == "CUDA out of memory"


def test_exit_code_matched_by_pod_failure_policy_fails_the_job(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    batch = client.BatchV1Api(api)
    policy = client.V1PodFailurePolicy(
        rules=[
            client.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    operator="In", values=[42]
                ),
            )
        ]
    )
    job_obj = gpu_job(
        "policy",
        pool="h100",
        pods=2,
        backoff_limit=5,  # the policy, not the backoff limit, must end the job
        pod_failure_policy=policy,
        annotations={FAKE_DURATION: "1s", FAKE_EXIT_CODE: "42"},
    )
    batch.create_namespaced_job(k8s_namespace, job_obj)
    failed = condition(wait_job_condition(batch, k8s_namespace, "policy", "Failed"), "Failed")
    assert failed is not None and failed["reason"] == "PodFailurePolicy"


def test_components_do_not_depend_on_the_checkout_that_started_them(
    k8s_cluster: K8sCluster,
) -> None:
    # the cluster is reused by later checkouts; the one that started it may be gone by then
    repo = Path(__file__).resolve().parents[3]
    pids = sorted((k8s_cluster.state_dir / "run").glob("*.pid"))
    assert pids
    for f in pids:
        cwd = Path(f"/proc/{f.read_text().strip()}/cwd").readlink()
        assert cwd == k8s_cluster.state_dir, (f.name, cwd)
        assert not cwd.is_relative_to(repo), (f.name, cwd)
