"""A job's pod template overlay (native.k8s.pod_template) lands in the Job's pod template,
adding beside what Isthmus renders and never replacing it: the pool's nodes, the GPUs, the
security settings, the isthmus.io/ keys and the rank variables stay the platform's."""

from __future__ import annotations

import re
from typing import Any

import pytest

from backends.base import Unsupported
from backends.k8s import overlay
from backends.k8s.manifests import render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from tests.harness.k8s_requests import request

H100 = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"pool": "h100"})
SETTINGS = K8sSettings(namespace="train", pod_labels={"site.example/tier": "gpu"})
TOLERATION = {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}


def _pod(pod_template: dict[str, Any]) -> dict[str, Any]:
    native = {"k8s": {"pod_template": pod_template}}
    (job,) = [m for m in render(request(native=native), H100, SETTINGS) if m["kind"] == "Job"]
    pod: dict[str, Any] = job["spec"]["template"]
    return pod


def test_the_overlay_lands_in_the_pod_template_beside_what_isthmus_renders() -> None:
    plain = _pod({"spec": {}})
    pod = _pod({
        "metadata": {"labels": {"example.com/cost-centre": "cv-42"},
                     "annotations": {"example.com/owner": "vision"}},
        "spec": {"tolerations": [TOLERATION], "priorityClassName": "team-high",
                 "runtimeClassName": "nvidia",
                 "containers": [{"env": [{"name": "NODE_IP", "valueFrom": {
                     "fieldRef": {"fieldPath": "status.hostIP"}}}],
                                 "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}]}]},
    })
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["labels"]["example.com/cost-centre"] == "cv-42"
    assert meta["annotations"]["example.com/owner"] == "vision"
    assert spec["tolerations"] == [*plain["spec"]["tolerations"], TOLERATION]  # appended
    assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("team-high", "nvidia")
    (container,) = spec["containers"]
    assert container["env"][-1]["name"] == "NODE_IP"
    assert container["env"][:-1] == plain["spec"]["containers"][0]["env"]
    assert container["envFrom"] == [{"configMapRef": {"name": "nccl-tuning"}}]
    # what the platform enforces is as it was without an overlay
    for key in ("affinity", "restartPolicy", "subdomain", "terminationGracePeriodSeconds"):
        assert spec[key] == plain["spec"][key]
    assert container["resources"] == plain["spec"]["containers"][0]["resources"]
    assert {k: v for k, v in meta["labels"].items() if k.startswith("isthmus.io/")} == \
        {k: v for k, v in plain["metadata"]["labels"].items() if k.startswith("isthmus.io/")}


@pytest.mark.parametrize(("pod_template", "named"), [
    ({"spec": {"nodeSelector": {"pool": "cheap"}}}, "spec.nodeSelector"),
    ({"spec": {"affinity": {}}}, "spec.affinity"),
    ({"spec": {"securityContext": {"runAsUser": 0}}}, "spec.securityContext"),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "64"}}}]}},
     "spec.containers[*].resources"),
    ({"spec": {"containers": [{"securityContext": {"privileged": True}}]}},
     "spec.containers[*].securityContext"),
    ({"spec": {"hostNetwork": True}}, "spec.hostNetwork"),
], ids=["node-selector", "affinity", "pod-security", "gpus", "privileged", "host-network"])
def test_what_the_platform_enforces_is_never_overlaid(pod_template: dict[str, Any],
                                                     named: str) -> None:
    """The backend's own guard (the spec model refuses these too, at submit)."""
    plain = _pod({"spec": {}})
    with pytest.raises(Unsupported, match=rf"native\.k8s\.pod_template\.{re.escape(named)}"):
        overlay.apply(plain, pod_template)


@pytest.mark.parametrize(("pod_template", "named"), [
    ({"metadata": {"labels": {"isthmus.io/job": "someone-else"}}}, "isthmus.io/job"),
    ({"metadata": {"labels": {"site.example/tier": "cpu"}}}, "site.example/tier"),
    ({"spec": {"containers": [{"env": [{"name": "MASTER_ADDR", "value": "evil"}]}]}},
     "MASTER_ADDR"),
    ({"spec": {"containers": [{"env": [{"name": "ISTHMUS_JOB_ID", "value": "x"}]}]}},
     "ISTHMUS_JOB_ID"),
    ({"spec": {"subdomain": "x"}}, "spec.subdomain"),
], ids=["isthmus-label", "admin-pod-label", "rank-variable", "isthmus-variable", "subdomain"])
def test_a_key_or_variable_isthmus_rendered_is_refused_not_replaced(
        pod_template: dict[str, Any], named: str) -> None:
    plain = _pod({"spec": {}})
    with pytest.raises(Unsupported, match=re.escape(named)):
        overlay.apply(plain, pod_template)


def test_a_class_name_isthmus_set_is_not_replaced() -> None:
    template = {"metadata": {}, "spec": {"runtimeClassName": "gvisor", "containers": []}}
    with pytest.raises(Unsupported, match="runtimeClassName"):
        overlay.apply(template, {"spec": {"runtimeClassName": "runc"}})
    assert template["spec"]["runtimeClassName"] == "gvisor"  # left as it was
