"""Nodes and pods (API JSON) -> pool snapshots with free GPUs, topology and queue depth. Pure.

Free GPUs of a node = allocatable minus the GPU requests of every non-terminal pod bound to it,
whoever created the pod. A node is unschedulable for Isthmus when it is cordoned, not Ready, or
carries a NoSchedule/NoExecute taint that the pool's pods do not tolerate (a pool's own taint,
``key=value`` of its node selector or a configured toleration, is tolerated).

Releases: when a node's busy GPUs are expected back, per running pod with a declared limit:
its start time plus the Isthmus limit (annotation isthmus.io/max-runtime) or the pod's own
activeDeadlineSeconds; pods without either have no known end. Any pod can carry any value
there (ours or not): a huge limit saturates far in the future, an unreadable one is ignored.
Resource quantities are bounded the same way (`quantity`).

Queue depth: pods not yet bound to a node, with their GPU demand counted in every pool that
has a node they could land on (node selector, required node affinity and taints), split into
Isthmus pods (label isthmus.io/managed-by=isthmus) and foreign ones.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from backends.k8s.manifests import ANN_MAX_RUNTIME, LABEL_MANAGED, LABEL_NAME
from backends.k8s.settings import MANAGED_BY, K8sPoolBinding, K8sSettings, pool_tolerations
from broker.domain.inventory import NodeSnapshot, PoolSnapshot, QueueDepth, TopologyPath
from broker.domain.spec import BackendKind
from broker.domain.timebox import add_seconds

TERMINAL = frozenset({"Succeeded", "Failed"})
MAX_QUANTITY = float(2**63)  # what the API server's int64 quantities can mean; larger is noise


def quantity(value: Any) -> float:
    """A Kubernetes resource quantity ('8', '500m', '100n', '2Ti', '1e3') as a number, read by
    the client library's parser and bounded to [0, MAX_QUANTITY] (NaN counts as 0), so that
    sums and int() of it stay numbers."""
    if value is None:
        return 0.0
    from kubernetes.utils import parse_quantity  # lazily, as every import of the SDK here

    number = float(parse_quantity(value))  # type: ignore[no-untyped-call]
    return 0.0 if math.isnan(number) else min(max(number, 0.0), MAX_QUANTITY)


def pod_request(pod: Mapping[str, Any], resource: str) -> float:
    """The pod's effective request of `resource`: max(sum over containers, any init container);
    an extended resource with only a limit requests that limit."""
    spec = pod.get("spec") or {}

    def one(c: Mapping[str, Any]) -> float:
        res = c.get("resources") or {}
        req = (res.get("requests") or {}).get(resource)
        if req is None:
            req = (res.get("limits") or {}).get(resource)
        return quantity(req)

    main = sum(one(c) for c in spec.get("containers") or ())
    init = max((one(c) for c in spec.get("initContainers") or ()), default=0.0)
    return max(main, init)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
            continue
        if t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def blocking_taints(node: Mapping[str, Any],
                    tolerations: Iterable[Mapping[str, Any]]) -> list[str]:
    tols = list(tolerations)
    out = []
    for taint in (node.get("spec") or {}).get("taints") or ():
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not tolerates(tols, taint):
            out.append(f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}")
    return out


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def unschedulable_reason(node: Mapping[str, Any],
                         tolerations: Iterable[Mapping[str, Any]]) -> str | None:
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    if not _ready(node):
        return "NotReady"
    taints = blocking_taints(node, tolerations)
    if taints:
        return "tainted " + ", ".join(taints)
    return None


# -- node affinity --------------------------------------------------------------------------

def _expr_ok(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or ()]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Would the scheduler's node filters (selector, required affinity, taints) allow it?"""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or ()
    if terms and not any(
        all(_expr_ok(e, labels.get(e.get("key"))) for e in t.get("matchExpressions") or ())
        and all(_expr_ok(e, meta.get("name") if e.get("key") == "metadata.name" else None)
                for e in t.get("matchFields") or ())
        for t in terms
    ):
        return False
    return not blocking_taints(node, spec.get("tolerations") or ())


# -- snapshots ------------------------------------------------------------------------------

def node_snapshot(node: Mapping[str, Any], used_gpus: float, pool: K8sPoolBinding,
                  settings: K8sSettings,
                  releases: Sequence[tuple[datetime, int]] = (),
                  requested: tuple[float, float] = (0.0, 0.0)) -> NodeSnapshot:
    """`requested`: the CPUs and memory bytes the node's non-terminal pods request."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = node.get("status") or {}
    alloc = status.get("allocatable") or {}
    total = int(quantity(alloc.get(settings.gpu_resource)))
    reason = unschedulable_reason(node, pool_tolerations(pool, settings))
    free = max(0, total - int(used_gpus + 0.999)) if reason is None else 0
    cpus = int(quantity(alloc.get("cpu")))
    memory = int(quantity(alloc.get("memory")))
    return NodeSnapshot(
        name=str(meta.get("name", "")),
        total_gpus=total,
        free_gpus=free,
        cpus=cpus,
        free_cpus=max(0, int(cpus - requested[0])),
        memory_bytes=memory,
        free_memory_bytes=max(0, int(memory - requested[1])),
        topology=TopologyPath(block=str(labels.get(settings.block_label, "")),
                              rack=str(labels.get(settings.rack_label, ""))),
        schedulable=reason is None,
        reason=reason,
        releases=tuple(sorted(releases)) if reason is None else (),
    )


def declared_end(pod: Mapping[str, Any]) -> datetime | None:
    """When a started, non-terminal pod is due to end by its declared limit, else None."""
    status = pod.get("status") or {}
    started = status.get("startTime")
    if not started or status.get("phase") in TERMINAL:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    limit = annotations.get(ANN_MAX_RUNTIME, (pod.get("spec") or {}).get("activeDeadlineSeconds"))
    try:
        seconds = int(limit) if limit is not None else None
        start = started if isinstance(started, datetime) else datetime.fromisoformat(
            str(started).replace("Z", "+00:00"))
    except (ValueError, TypeError, OverflowError):
        return None
    return None if seconds is None or seconds < 0 else add_seconds(start, seconds)


def pod_release(pod: Mapping[str, Any], resource: str) -> tuple[datetime, int] | None:
    """(expected end, GPUs) of a running pod with a declared limit, else None."""
    end = declared_end(pod)
    gpus = int(pod_request(pod, resource))
    return (end, gpus) if end is not None and gpus > 0 else None


def node_usage(pods: Iterable[Mapping[str, Any]], resource: str
               ) -> tuple[dict[str, float], dict[str, list[tuple[datetime, int]]],
                          dict[str, tuple[float, float]]]:
    """In one pass over the pods: the GPUs requested on each node by its non-terminal pods,
    when each node expects them back (`pod_release`), and the CPUs and memory they request."""
    used: dict[str, float] = defaultdict(float)
    releases: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    requested: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        gpus = pod_request(pod, resource)
        used[node] += gpus
        cpu, mem = requested[node]
        requested[node] = (cpu + pod_request(pod, "cpu"), mem + pod_request(pod, "memory"))
        end = declared_end(pod)
        if end is not None and int(gpus) > 0:
            releases[node].append((end, int(gpus)))
    return used, releases, requested


def queue_depths(pods: Iterable[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
                 pools: Sequence[K8sPoolBinding], resource: str) -> dict[str, QueueDepth]:
    """Pending GPU demand per pool; a pod counts in each pool it could land in."""
    pool_nodes = {p.name: [n for n in nodes
                           if p.selects((n.get("metadata") or {}).get("labels") or {})]
                  for p in pools}
    mine: dict[str, float] = defaultdict(float)
    foreign: dict[str, float] = defaultdict(float)
    jobs: dict[str, set[str]] = defaultdict(set)
    for pod in pods:
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if spec.get("nodeName") or status.get("phase") != "Pending":
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        gpus = pod_request(pod, resource)
        if gpus <= 0:
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        isthmus = labels.get(LABEL_MANAGED) == MANAGED_BY
        for p in pools:
            if not any(node_matches(pod, n) for n in pool_nodes[p.name]):
                continue
            if isthmus:
                mine[p.name] += gpus
                jobs[p.name].add(str(labels.get(LABEL_NAME, "")))
            else:
                foreign[p.name] += gpus
    return {p.name: QueueDepth(isthmus_pending_gpus=int(mine[p.name]),
                               foreign_pending_gpus=int(foreign[p.name]),
                               isthmus_pending_jobs=len(jobs[p.name]))
            for p in pools}


def build_pools(
    backend: str,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    pools: Sequence[K8sPoolBinding],
    settings: K8sSettings,
) -> tuple[PoolSnapshot, ...]:
    used, releases, requested = node_usage(pods, settings.gpu_resource)
    depth = queue_depths(pods, nodes, pools, settings.gpu_resource)
    out = []
    for pool in pools:
        snaps = []
        for node in nodes:
            meta = node.get("metadata") or {}
            if not pool.selects(meta.get("labels") or {}):
                continue
            name = str(meta.get("name"))
            snaps.append(node_snapshot(node, used.get(name, 0.0), pool, settings,
                                       releases.get(name, ()), requested.get(name, (0.0, 0.0))))
        snaps.sort(key=lambda n: n.name)
        out.append(PoolSnapshot(
            name=pool.name, backend_kind=BackendKind.K8S, backend=backend, flavor=pool.flavor,
            selector=pool.selector_text, cost_weight=pool.cost_weight, shared=pool.shared,
            drained=pool.drained, nodes=tuple(snaps), queue=depth[pool.name],
            # a required node affinity NotIn keeps queued pods off held nodes (manifests.py),
            # shown with kube-scheduler (plain mode); kueue mode does not render it (Kueue's
            # topology-aware scheduling picks the nodes); volcano renders it, not yet tested
            excludes_nodes=settings.mode(pool.name) == "plain",
        ))
    return tuple(out)

