"""When a node's busy GPUs are expected back, from pods' declared limits (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backends.k8s.inventory import build_pools, pod_release
from backends.k8s.manifests import ANN_MAX_RUNTIME, render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from broker.domain.timebox import FAR_FUTURE
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import foreign_pod, gpu_node

POOL = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})
START = "2026-11-29T10:00:00Z"
T0 = datetime(2026, 11, 29, 10, tzinfo=UTC)


def running(pod: dict[str, Any], node: str, *, started: str | None = START,
            phase: str = "Running") -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase, **({"startTime": started} if started else {})}
    return pod


def isthmus_pod(node: str) -> dict[str, Any]:
    """A pod as the Job controller makes it from our template (its annotations included)."""
    job = render(request(replicas=1, gpus=8), POOL, K8sSettings())[0]
    tmpl = job["spec"]["template"]
    pod = {"metadata": dict(tmpl["metadata"]), "spec": dict(tmpl["spec"])}
    return running(pod, node)


def with_deadline(seconds: int) -> dict[str, Any]:
    pod = foreign_pod("x", gpus=4)
    pod["spec"]["activeDeadlineSeconds"] = seconds
    return pod


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (isthmus_pod("n1"), (T0 + timedelta(hours=2), 8)),  # max_runtime 2h of the request
        (running(with_deadline(600), "n1"), (T0 + timedelta(minutes=10), 4)),
        (running(foreign_pod("x", gpus=4), "n1"), None),  # no declared limit: no known end
        (running(with_deadline(600), "n1", started=None), None),  # not started yet
        (running(with_deadline(600), "n1", phase="Succeeded"), None),  # already gone
        (running(with_deadline(600), "n1") | {"metadata": {"annotations": {
            ANN_MAX_RUNTIME: "soon"}}}, None),  # unreadable limit: ignored, not an error
        (running(with_deadline(600), "n1") | {"spec": {"nodeName": "n1", "containers": []}},
         None),  # no GPUs
    ],
    ids=["isthmus-annotation", "pod-deadline", "no-limit", "not-started", "terminal",
         "bad-annotation", "no-gpus"],
)
def test_pod_release(pod: dict[str, Any], expected: tuple[datetime, int] | None) -> None:
    assert pod_release(pod, "nvidia.com/gpu") == expected


def test_nodes_carry_their_pods_releases_sorted_and_unusable_nodes_none() -> None:
    settings = K8sSettings()
    nodes = [gpu_node("n1", "h100", "r0"), gpu_node("n2", "h100", "r0", unschedulable=True)]
    for n in nodes:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    pods = [running(with_deadline(3600), "n1"), running(with_deadline(600), "n1"),
            running(with_deadline(600), "n2")]
    (snap,) = build_pools("k8s", nodes, pods, [POOL], settings)
    by_name = {n.name: n for n in snap.nodes}
    assert by_name["n1"].releases == ((T0 + timedelta(minutes=10), 4),
                                      (T0 + timedelta(hours=1), 4))
    assert by_name["n1"].free_gpus == 0
    assert by_name["n2"].releases == ()


def _annotated(value: object) -> dict[str, Any]:
    pod = running(with_deadline(600), "n1")
    pod["metadata"] = {"annotations": {ANN_MAX_RUNTIME: value}}
    return pod


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(_annotated("1000000000000"), (FAR_FUTURE.replace(tzinfo=UTC), 4),
                     id="annotation-1e12"),
        pytest.param(_annotated("9" * 400), (FAR_FUTURE.replace(tzinfo=UTC), 4),
                     id="annotation-400-digits"),
        pytest.param(running(with_deadline(10**12), "n1"), (FAR_FUTURE.replace(tzinfo=UTC), 4),
                     id="deadline-1e12"),
        pytest.param(running(with_deadline(float("inf")), "n1"), None,  # type: ignore[arg-type]
                     id="deadline-inf"),
        pytest.param(_annotated(["a", "list"]), None, id="annotation-not-a-number"),
        pytest.param(running(with_deadline(600), "n1", started="not a time"), None,
                     id="bad-start"),
    ],
)
def test_absurd_limits_of_any_pod_saturate_or_are_ignored(
    pod: dict[str, Any], expected: tuple[datetime, int] | None
) -> None:
    assert pod_release(pod, "nvidia.com/gpu") == expected


@pytest.mark.parametrize("value", ["1e400", "1e30", "9" * 400, "NaN", "inf"],
                         ids=["1e400", "1e30", "400-digits", "NaN", "inf"])
def test_absurd_gpu_quantities_do_not_break_the_inventory(value: str) -> None:
    nodes = [gpu_node("n1", "h100", "r0")]
    nodes[0]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    pod = running(with_deadline(600), "n1")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": value}}
    (snap,) = build_pools("k8s", nodes, [pod], [POOL], K8sSettings())
    assert snap.nodes[0].free_gpus in (0, 8)  # a number, whatever the pod claims


def test_free_cpus_and_memory_are_the_node_minus_its_live_pods_requests() -> None:
    """They were left at 0, so no job asking for CPUs or memory ever fit a Kubernetes node
    (examples/jobs/demo/02-llm-pretrain.yaml waited for ever with TopologyUnsatisfiable)."""
    nodes = [gpu_node("n1", "h100", "r0"), gpu_node("n2", "h100", "r0")]
    for n in nodes:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    busy = running(foreign_pod("x", gpus=4), "n1")
    busy["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "24500m", "memory": "64Gi"}
    done = running(foreign_pod("y", gpus=4), "n1", phase="Succeeded")
    done["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100", "memory": "1Ti"}
    (snap,) = build_pools("k8s", nodes, [busy, done], [POOL], K8sSettings())
    by_name = {n.name: n for n in snap.nodes}
    assert (by_name["n1"].cpus, by_name["n1"].free_cpus) == (224, 199)
    assert by_name["n1"].free_memory_bytes == 2 * 2**40 - 64 * 2**30
    assert (by_name["n2"].free_cpus, by_name["n2"].free_memory_bytes) == (224, 2 * 2**40)
