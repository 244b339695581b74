"""A pod gang queued in Kubernetes while a starving gang holds nodes there is kept off them: the
placement's exclude_nodes become a required node affinity `NotIn` on the hostname label, and
plain-mode pools say they honour it (kueue mode renders nothing: Kueue's topology-aware
scheduling picks the nodes; volcano is not shown to honour it; both close the queue instead,
policies/queue_guard.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backends.base import SubmitRequest
from backends.k8s.inventory import build_pools
from backends.k8s.manifests import render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import gpu_node

H100 = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})
PLAIN = K8sSettings(namespace="train")


def _excluding(*nodes: str) -> SubmitRequest:
    req = request(replicas=2, gpus=4)
    return replace(req, placement=req.placement.model_copy(update={"exclude_nodes": nodes}))


def _expressions(req: SubmitRequest, settings: K8sSettings) -> list[dict[str, Any]]:
    (job,) = [m for m in render(req, H100, settings) if m["kind"] == "Job"]
    aff = job["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = aff.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    (term,) = terms.get("nodeSelectorTerms", [{}])
    return list(term.get("matchExpressions", []))


def test_excluded_nodes_become_a_required_not_in_on_the_hostname_label() -> None:
    exprs = _expressions(_excluding("gpu-r1-n1", "gpu-r1-n0"), PLAIN)
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn",
            "values": ["gpu-r1-n0", "gpu-r1-n1"]} in exprs
    # the same term as the pool's selector: both must hold (terms are ORed, expressions ANDed)
    assert {"key": "isthmus.io/pool", "operator": "In", "values": ["h100"]} in exprs
    assert not any(e["operator"] == "NotIn" for e in _expressions(_excluding(), PLAIN))


def test_kueue_mode_renders_no_exclusion_and_its_pools_do_not_claim_it() -> None:
    kueue = K8sSettings.from_dict({"namespace": "train", "modes": {"h100": "kueue"},
                                   "kueue_queues": {"h100": "team-a"}})
    assert not any(e["operator"] == "NotIn"
                   for e in _expressions(_excluding("gpu-r1-n0"), kueue))
    nodes = [gpu_node("n1", "h100", "r0")]
    (snap,) = build_pools("k8s", nodes, [], [H100], kueue)
    assert snap.excludes_nodes is False


@pytest.mark.parametrize(("mode", "honours"), [("plain", True), ("volcano", False)])
def test_only_plain_pools_say_they_exclude(mode: str, honours: bool) -> None:
    # volcano renders the same affinity, but no test shows its scheduler honouring it yet
    settings = K8sSettings.from_dict({"namespace": "train", "modes": {"h100": mode}})
    (snap,) = build_pools("k8s", [gpu_node("n1", "h100", "r0")], [], [H100], settings)
    assert snap.excludes_nodes is honours
