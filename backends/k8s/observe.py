"""What `K8sBackend.observe` and `lookup` read: the watches (Job, Pod, Node and, with Kueue,
Workload reflectors, label-selected across namespaces when each team has its own), the nodes
that went away under running ranks, and the Fact of one gang from its Job, pods and finding."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from backends.k8s.client import ApiError, Apis, call
from backends.k8s.kueue import KUEUE_GROUP, WORKLOADS
from backends.k8s.manifests import LABEL_ATTEMPT, LABEL_JOB, LABEL_NAME, MANAGED_SELECTOR
from backends.k8s.watch import Reflector
from broker.domain.facts import Fact, Finding

JSON = dict[str, Any]


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def make_reflectors(apis: Apis, kueue: bool) -> dict[str, Reflector]:
    """The watches of the adapter: Jobs and pods (ours, by label), nodes, and Kueue's
    Workloads (`kueue`; not labelled by us: all of the namespace)."""
    s = apis.settings
    ns = s.namespace
    kw: dict[str, Any] = {"timeout": s.request_timeout_s,
                          "watch_timeout_s": s.watch_timeout_s,
                          "max_backoff_s": s.max_backoff_s}
    batch, core = apis.batch, apis.core
    if s.per_team:  # every team's namespace: one watch across them, by our label
        jobs: Callable[..., Any] = functools.partial(
            batch.list_job_for_all_namespaces, label_selector=MANAGED_SELECTOR)
        pods: Callable[..., Any] = functools.partial(
            core.list_pod_for_all_namespaces, label_selector=MANAGED_SELECTOR)
    else:
        jobs = functools.partial(batch.list_namespaced_job, ns,
                                 label_selector=MANAGED_SELECTOR)
        pods = functools.partial(core.list_namespaced_pod, ns,
                                 label_selector=MANAGED_SELECTOR)
    reflectors = {
        "jobs": Reflector("jobs", jobs, **kw),
        "pods": Reflector("pods", pods, **kw),
        "nodes": Reflector("nodes", core.list_node, **kw),
    }
    if kueue:
        cu, version = apis.custom, s.kueue_api_version
        workloads: Callable[..., Any] = (
            functools.partial(cu.list_cluster_custom_object, KUEUE_GROUP, version,
                              WORKLOADS) if s.per_team else
            functools.partial(cu.list_namespaced_custom_object, KUEUE_GROUP, version, ns,
                              WORKLOADS))
        reflectors["workloads"] = Reflector("workloads", workloads, **kw)
    return reflectors


def gang_of(obj: Mapping[str, Any]) -> str:
    """The gang (Job name) an Isthmus pod belongs to, by its label."""
    return str((meta_of(obj).get("labels") or {}).get(LABEL_NAME, ""))


def pods_by_gang(pods: Iterable[JSON], gangs: set[str] | None = None) -> dict[str, list[JSON]]:
    """The pods of each gang (of those in `gangs` only, when given)."""
    by_job: dict[str, list[JSON]] = defaultdict(list)
    for pod in pods:
        gang = gang_of(pod)
        if gangs is None or gang in gangs:
            by_job[gang].append(pod)
    return by_job


def lost_nodes(apis: Apis, pods: Sequence[Mapping[str, Any]],
               nodes: Callable[[], Sequence[JSON]]) -> frozenset[str]:
    """Nodes that Isthmus ranks are bound to and that no longer exist (checked by name:
    a node cache lagging behind a new node must not kill a gang)."""
    used = {str(p["spec"]["nodeName"]) for p in pods
            if (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") in ("Pending", "Running")}
    if not used:
        return frozenset()
    known = {str(meta_of(n).get("name")) for n in nodes()}
    lost = set()
    for node in sorted(used - known):
        try:
            call("read node", apis.core.read_node, node,
                 timeout=apis.settings.request_timeout_s)
        except ApiError as exc:
            if exc.status == 404:
                lost.add(node)
    return frozenset(lost)


def gang_fact(apis: Apis, backend: str, job: Mapping[str, Any], finding: Finding,
              now: datetime, pods: Sequence[Mapping[str, Any]],
              nodes: Callable[[], Sequence[JSON]]) -> Fact:
    """The Fact of one gang: which object (the Job's name, uid and labels) and what was
    found, with what its ranks run (images, GPU models of their nodes)."""
    meta = meta_of(job)
    image_ids, gpu_models = _ran_with(apis, pods, finding.nodes, nodes)
    labels = meta.get("labels") or {}
    attempt = labels.get(LABEL_ATTEMPT)
    return finding.fact(
        backend=backend, backend_name=str(meta.get("name", "")),
        backend_id=str(meta.get("uid", "")) or None, job_id=labels.get(LABEL_JOB),
        attempt=int(attempt) if attempt and str(attempt).isdigit() else None,
        observed_at=now, image_ids=image_ids, gpu_models=gpu_models,
    )


def _ran_with(apis: Apis, pods: Sequence[Mapping[str, Any]], used: Sequence[str],
              nodes: Callable[[], Sequence[JSON]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(image IDs the ranks' containers report, GPU models of the nodes they run on)."""
    settings = apis.settings
    ids = {str(cs["imageID"]) for p in pods
           for cs in (p.get("status") or {}).get("containerStatuses") or ()
           if cs.get("name") == settings.container_name and cs.get("imageID")}
    models: set[str] = set()
    if used:
        wanted = set(used)
        for node in nodes():
            meta = meta_of(node)
            model = (meta.get("labels") or {}).get(settings.gpu_product_label)
            if meta.get("name") in wanted and model:
                models.add(str(model))
    return tuple(sorted(ids)), tuple(sorted(models))
