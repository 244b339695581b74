"""Builders of plain Kubernetes manifests for tests: fake GPU nodes (the testenv's labels
contract, deploy/testenv/k8s/README.md) and foreign pods taking GPUs."""

from __future__ import annotations

import secrets
from typing import Any

POOL_LABEL = "isthmus.io/pool"
RACK_LABEL = "topology.isthmus.io/rack"
BLOCK_LABEL = "topology.isthmus.io/block"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def new_job_id() -> str:
    return "0t" + secrets.token_hex(7)


def gpu_node(name: str, pool: str, rack: str, *, kwok: bool = True, gpus: int = 8,
             taints: list[dict[str, str]] | None = None,
             unschedulable: bool = False) -> dict[str, Any]:
    """A fake GPU node like deploy/testenv/k8s/up makes (kwok plays it when `kwok`), tainted
    for its own pool so that nobody else's pods land on it."""
    res = {"cpu": "224", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"} if kwok else {},
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                POOL_LABEL: pool, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559", BLOCK_LABEL: f"{pool}-block-0",
                RACK_LABEL: rack,
            },
        },
        "spec": {
            "unschedulable": unschedulable,
            "taints": [{"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"},
                       *(taints or [])],
        },
        "status": {"capacity": res, "allocatable": res},
    }


def foreign_pod(name: str, *, gpus: int, pool: str | None = None, node: str | None = None,
                annotations: dict[str, str] | None = None,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod not made by Isthmus asking for GPUs, placed through the scheduler."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "other:latest",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    selector = {}
    if pool:
        selector[POOL_LABEL] = pool
        spec["tolerations"] = [{"key": POOL_LABEL, "operator": "Equal", "value": pool,
                                "effect": "NoSchedule"}]
    if node:
        selector["kubernetes.io/hostname"] = node
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "someone-else"},
                     "annotations": {"isthmus.io/fake-duration": "never",
                                     **(annotations or {})}},
        "spec": spec,
    }
