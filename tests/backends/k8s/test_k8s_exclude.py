"""On the real control plane (plain mode), a gang queued without nodes but with excluded nodes
(as admission queues one while a starving gang holds them: policies/queue_guard.py) is bound
only outside them: with every h100 node but one excluded, its pod lands on that one. The
required node affinity `NotIn` is what kube-scheduler honours; without it the pod may land
on any of the 8 h100 nodes (this test would then still pass about once in 8)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kubernetes import client

from backends.k8s.manifests import LABEL_NAME
from broker.domain.facts import Phase
from tests.fixtures.k8s import FAKE_DURATION, as_dict
from tests.harness.k8s_backend import MakeBackend, wait_fact
from tests.harness.k8s_requests import request

pytestmark = pytest.mark.k8s


def test_a_queued_gang_is_bound_only_outside_its_excluded_nodes(
    make_backend: MakeBackend, api: client.ApiClient, k8s_namespace: str
) -> None:
    backend = make_backend(pod_annotations={FAKE_DURATION: "3s"})
    h100 = backend.inventory().pool("h100")
    assert h100 is not None and h100.excludes_nodes
    free = sorted(n.name for n in h100.nodes if n.schedulable and n.free_gpus >= 8)
    assert free, f"no h100 node with 8 free GPUs: {h100.nodes}"
    keep = free[-1]
    req = request(pool="h100", replicas=1, gpus=8)
    placement = req.placement.model_copy(update={
        "exclude_nodes": tuple(sorted(n.name for n in h100.nodes if n.name != keep))})
    req = dataclasses.replace(req, placement=placement)
    backend.submit(req)
    fact = wait_fact(backend, req.name, lambda f: f.phase is Phase.SUCCEEDED)
    assert fact.nodes == (keep,), fact
    core = client.CoreV1Api(api)
    pods: list[dict[str, Any]] = as_dict(core.list_namespaced_pod(
        k8s_namespace, label_selector=f"{LABEL_NAME}={req.name}"))["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {keep}
    terms = pods[0]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert any(e["operator"] == "NotIn" for t in terms for e in t["matchExpressions"])
