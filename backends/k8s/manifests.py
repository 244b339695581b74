"""The Kubernetes objects of one attempt, rendered as plain API dicts. Pure.

A gang is an Indexed ``batch/v1`` Job (completions = parallelism = replicas, backoffLimit 0:
Isthmus owns retries) plus a headless Service, so that rank ``i`` is reachable as
``<name>-<i>.<name>`` (pod hostname + subdomain). ``render`` returns the exact manifests; the
adapter creates them in order and only adds ownerReferences (which need the Job's uid).

Modes per pool: ``plain`` (the default scheduler), ``kueue`` (the Job is created suspended with
a queue-name label and Kueue admits it) and ``volcano`` (schedulerName volcano plus a PodGroup
with minMember = replicas).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from backends.base import SubmitRequest, Unsupported
from backends.k8s import batch_script, overlay
from backends.k8s.settings import (
    LABEL_PREFIX,
    MANAGED_BY,
    K8sPoolBinding,
    K8sSettings,
    pool_tolerations,
)
from broker.domain.topology import TopologyLevel

# labels on every Isthmus object (Job, its pods, Service, PodGroup)
LABEL_JOB = LABEL_PREFIX + "job"
LABEL_ATTEMPT = LABEL_PREFIX + "attempt"
LABEL_MANAGED = LABEL_PREFIX + "managed-by"
LABEL_NAME = LABEL_PREFIX + "name"  # the object name, isthmus-<job>-<attempt>
LABEL_TEAM = LABEL_PREFIX + "team"  # on a team's own namespace
MANAGED_SELECTOR = f"{LABEL_MANAGED}={MANAGED_BY}"
# annotations
ANN_POOL = LABEL_PREFIX + "pool"
ANN_SPEC_HASH = LABEL_PREFIX + "spec-hash"
ANN_TEARDOWN = LABEL_PREFIX + "teardown"  # "<CATEGORY>/<Reason>: message", set before a kill
ANN_MAX_RUNTIME = LABEL_PREFIX + "max-runtime"  # pod: the declared limit in seconds (releases)
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
PODGROUP_API = "scheduling.volcano.sh/v1beta1"

# the progress token reaches the ranks through a per-attempt Secret of the Job's name
TOKEN_ENV = "ISTHMUS_PROGRESS_TOKEN"  # noqa: S105 - a variable name, not a secret
SECRET_TOKEN_KEY = "progress-token"  # noqa: S105 - a key name
# set by Isthmus for every rank; the job's env may override MASTER_PORT only
RESERVED_ENV = ("MASTER_ADDR", "WORLD_SIZE", "NNODES", "NODE_RANK", "RANK", "GPUS_PER_NODE")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 56  # pod hostname <name>-<index> must stay within 63 characters


def labels_for(request: SubmitRequest) -> dict[str, str]:
    """Isthmus's own labels (what adoption compares)."""
    return {
        LABEL_JOB: request.job_id,
        LABEL_ATTEMPT: str(request.attempt),
        LABEL_MANAGED: MANAGED_BY,
        LABEL_NAME: request.name,
    }


def domain_value(domain: str) -> str:
    """The label value of a topology domain: 'block/rack' -> 'rack', 'block' -> 'block'."""
    return domain.rstrip("/").rsplit("/", 1)[-1]


def node_affinity(
    request: SubmitRequest, pool: K8sPoolBinding, settings: K8sSettings, *, pin_domain: bool = True
) -> dict[str, Any]:
    """Every rank on the pool's nodes, inside the chosen topology domain (or on the chosen
    nodes when the placement names them), never on the placement's excluded nodes (held for
    a starving gang while this job waits in the backend). Without `pin_domain` (kueue mode:
    Kueue's topology-aware scheduling places the ranks) the pool's selector only."""
    placement = request.placement
    exprs: list[dict[str, Any]] = [
        {"key": k, "operator": "In", "values": [v]} for k, v in sorted(pool.node_selector.items())
    ]
    term: dict[str, Any] = {"matchExpressions": exprs}
    level = placement.topology_level
    domain = placement.topology_domain
    if placement.nodes and pin_domain:
        # By the hostname label: a `matchFields` term on metadata.name takes one value only,
        # so it cannot name the several nodes of a gang (the API server refuses the Job).
        exprs.append({"key": settings.hostname_label, "operator": "In",
                      "values": sorted(set(placement.nodes))})
    elif pin_domain and level is not None and domain:
        if level is TopologyLevel.RACK:
            exprs.append(
                {"key": settings.rack_label, "operator": "In", "values": [domain_value(domain)]}
            )
        elif level is TopologyLevel.BLOCK:
            exprs.append(
                {"key": settings.block_label, "operator": "In", "values": [domain_value(domain)]}
            )
        elif level is TopologyLevel.NODE:
            term["matchFields"] = [
                {"key": "metadata.name", "operator": "In", "values": [domain_value(domain)]}
            ]
    if placement.exclude_nodes and pin_domain:
        exprs.append({"key": settings.hostname_label, "operator": "NotIn",
                      "values": sorted(set(placement.exclude_nodes))})
    if not exprs:
        del term["matchExpressions"]
    if not term:
        return {}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def one_pod_a_node(request: SubmitRequest, settings: K8sSettings) -> dict[str, Any]:
    """A gang that asks for a node per replica (sbatch -N): no two of its pods on one node,
    required of the scheduler (by the job's own label, attempt by attempt)."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {LABEL_JOB: request.job_id,
                                          LABEL_ATTEMPT: str(request.attempt)}},
        "topologyKey": settings.hostname_label,
    }]}}


def tolerations_for(pool: K8sPoolBinding, settings: K8sSettings) -> list[dict[str, Any]]:
    tols = [dict(t) for t in pool_tolerations(pool, settings)]
    # A lost node should end the gang in about a minute, not after the default 5 minutes.
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        tols.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                     "tolerationSeconds": settings.node_lost_toleration_s})
    return tols


def env_for(request: SubmitRequest, settings: K8sSettings) -> list[dict[str, Any]]:
    spec = request.snapshot.spec
    replicas = spec.gang.replicas
    values: dict[str, str] = {"MASTER_PORT": str(settings.master_port)}
    values.update(spec.env)
    values.update(request.env)
    values.update({
        "ISTHMUS_JOB_ID": request.job_id,
        "ISTHMUS_ATTEMPT": str(request.attempt),
        "MASTER_ADDR": f"{request.name}-0.{request.name}",
        "WORLD_SIZE": str(replicas),
        "NNODES": str(replicas),
        "GPUS_PER_NODE": str(spec.gang.gpus_per_replica),
    })
    token = values.pop(TOKEN_ENV, None)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    if token is not None:  # from the attempt's Secret: never a literal on the Job
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": request.name, "key": SECRET_TOKEN_KEY}}})
    index_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    env += [{"name": "NODE_RANK", "valueFrom": index_ref},
            {"name": "RANK", "valueFrom": index_ref}]
    return env


def container_for(request: SubmitRequest, settings: K8sSettings) -> dict[str, Any]:
    spec = request.snapshot.spec
    ep = spec.entrypoint
    if not ep.image:
        raise Unsupported("entrypoint.image: a Kubernetes job needs an image")
    limits: dict[str, str] = {settings.gpu_resource: str(spec.gang.gpus_per_replica)}
    requests: dict[str, str] = {}
    if spec.gang.cpus_per_replica:
        limits["cpu"] = requests["cpu"] = str(spec.gang.cpus_per_replica)
    if spec.gang.memory_per_replica:
        limits["memory"] = requests["memory"] = str(spec.gang.memory_per_replica)
    container: dict[str, Any] = {
        "name": settings.container_name,
        "image": ep.image,
        "env": env_for(request, settings),
        "resources": {"limits": limits, **({"requests": requests} if requests else {})},
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port}],
    }
    if ep.command is not None:
        container["command"] = list(ep.command)
    elif ep.script is not None and ep.launcher == "batch":  # as sbatch: batch_script.py
        container["command"] = batch_script.command(ep.script)
        container["env"] += batch_script.env(request)
    elif ep.script is not None:
        container["command"] = ["/bin/bash", "-c", ep.script]
    if spec.mounts:
        container["volumeMounts"] = [
            {"name": f"data-{i}", "mountPath": m.path, "readOnly": m.read_only}
            for i, m in enumerate(spec.mounts)
        ]
    return container


def pod_failure_policy(settings: K8sSettings) -> dict[str, Any]:
    """Fail the Job at the first bad rank, with the cause in the Job's Failed condition.

    backoffLimit 0 would fail it too; the rules make the condition message name the pod and
    the evidence (exit code or disruption), which classification reads.
    """
    return {"rules": [
        {"action": "FailJob",
         "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": settings.container_name, "operator": "NotIn",
                         "values": [0]}},
    ]}


def check_name(name: str) -> None:
    if len(name) > MAX_NAME or not _DNS_LABEL.match(name):
        raise Unsupported(
            f"name '{name}': a Kubernetes gang name must be a DNS label of at most {MAX_NAME} "
            "characters (lowercase letters, digits, '-', starting with a letter)"
        )


def render(
    request: SubmitRequest, pool: K8sPoolBinding, settings: K8sSettings | None = None
) -> list[dict[str, Any]]:
    """The manifests of one attempt: Job, Service (and PodGroup), and the Secret of the
    progress token when the request carries one (the adapter creates it first)."""
    settings = settings or K8sSettings()
    check_name(request.name)
    spec = request.snapshot.spec
    ns = team_namespace(settings, spec.team)
    labels = {**spec.labels, **labels_for(request)}  # the user's, then ours (never overridden)
    manifests: list[dict[str, Any]] = [job_manifest(request, pool, settings, ns, labels),
                                       service_manifest(request.name, ns, labels, settings)]
    if settings.mode(pool.name) == "volcano":
        manifests.append(podgroup_manifest(request, pool, settings, ns, labels))
    token = request.env.get(TOKEN_ENV)
    if token is not None:
        manifests.append(token_secret(request, ns, dict(labels), token))
    return manifests


def team_namespace(settings: K8sSettings, team: str) -> str:
    """The namespace of a team's gangs, checked to be a DNS label."""
    ns = settings.namespace_for(team)
    if not _DNS_LABEL.match(ns) or len(ns) > 63:
        raise Unsupported(f"namespace '{ns}' (setting namespace: {settings.namespace}) is not "
                          "a DNS label of at most 63 characters")
    return ns


def job_manifest(request: SubmitRequest, pool: K8sPoolBinding, settings: K8sSettings, ns: str,
                 labels: dict[str, str]) -> dict[str, Any]:
    """The Indexed Job of the gang (suspended for Kueue, which admits it)."""
    spec = request.snapshot.spec
    mode = settings.mode(pool.name)
    job_labels = dict(labels)
    if mode == "kueue":
        job_labels[KUEUE_QUEUE] = settings.kueue_queues[pool.name]
    job_spec: dict[str, Any] = {
        "completions": spec.gang.replicas,
        "parallelism": spec.gang.replicas,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(settings),
        # max_runtime counts from the start of the Job; the gang gets its start-up slack
        "activeDeadlineSeconds": spec.max_runtime + int(settings.all_ranks_timeout_s + 0.999),
        "template": pod_template(request, pool, settings),
    }
    if mode == "kueue":
        job_spec["suspend"] = True
    if settings.ttl_after_finished_s is not None:
        job_spec["ttlSecondsAfterFinished"] = settings.ttl_after_finished_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": request.name, "namespace": ns, "labels": job_labels,
                     "annotations": {ANN_POOL: pool.name,
                                     ANN_SPEC_HASH: request.snapshot.spec_hash}},
        "spec": job_spec,
    }


def pod_template(request: SubmitRequest, pool: K8sPoolBinding,
                 settings: K8sSettings) -> dict[str, Any]:
    """The pod of every rank: labels and annotations (the user's, then the admin's
    pod_labels/pod_annotations: a tenant must not opt out of e.g. `sidecar.istio.io/inject`,
    then ours), the container, placement and volumes; then the job's pod template overlay
    (native.k8s.pod_template, overlay.py), which adds and never replaces."""
    spec = request.snapshot.spec
    mode = settings.mode(pool.name)
    pod_labels = {**spec.labels, **settings.pod_labels, **labels_for(request)}
    pod_annotations: dict[str, str] = {**spec.annotations, **settings.pod_annotations,
                                       ANN_MAX_RUNTIME: str(spec.max_runtime)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": request.name,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.checkpoint.grace,
        "tolerations": tolerations_for(pool, settings),
        "containers": [container_for(request, settings)],
    }
    affinity = node_affinity(request, pool, settings, pin_domain=mode != "kueue")
    if spec.gang.one_per_node and spec.gang.replicas > 1:
        affinity.update(one_pod_a_node(request, settings))
    if affinity:
        pod_spec["affinity"] = affinity
    if spec.mounts:
        pod_spec["volumes"] = [
            {"name": f"data-{i}",
             "persistentVolumeClaim": {"claimName": m.name, "readOnly": m.read_only}}
            for i, m in enumerate(spec.mounts)
        ]
    _scheduler_marks(request, mode, settings, pod_spec, pod_annotations)
    template = {
        "metadata": {"labels": pod_labels,
                     **({"annotations": pod_annotations} if pod_annotations else {})},
        "spec": pod_spec,
    }
    native = spec.native.k8s if spec.native is not None else None
    # last, so that the overlay meets every value Isthmus set and can only add beside them
    return overlay.apply(template, native.pod_template) if native is not None else template


def _scheduler_marks(request: SubmitRequest, mode: str, settings: K8sSettings,
                     pod_spec: dict[str, Any], pod_annotations: dict[str, str]) -> None:
    """What Kueue (the topology a gang must stay inside) or Volcano (its scheduler and the
    gang's PodGroup) read on each pod."""
    level = request.placement.topology_level
    if mode == "kueue":
        if level is TopologyLevel.RACK:
            pod_annotations[KUEUE_TAS_REQUIRED] = settings.rack_label
        elif level is TopologyLevel.BLOCK:
            pod_annotations[KUEUE_TAS_REQUIRED] = settings.block_label
    if mode == "volcano":
        pod_spec["schedulerName"] = "volcano"
        pod_annotations[VOLCANO_GROUP] = request.name


def service_manifest(name: str, ns: str, labels: dict[str, str],
                     settings: K8sSettings) -> dict[str, Any]:
    """The headless Service that makes rank i reachable as <name>-<i>.<name>."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_NAME: name},
            "publishNotReadyAddresses": True,  # ranks rendezvous before they are Ready
            "ports": [{"name": "rendezvous", "port": settings.master_port}],
        },
    }


def podgroup_manifest(request: SubmitRequest, pool: K8sPoolBinding, settings: K8sSettings,
                      ns: str, labels: dict[str, str]) -> dict[str, Any]:
    """Volcano's PodGroup: the gang starts whole (minMember = replicas) or not at all."""
    gang = request.snapshot.spec.gang
    pg_spec: dict[str, Any] = {
        "minMember": gang.replicas,
        "minResources": {settings.gpu_resource: str(gang.total_gpus)},
    }
    queue = settings.volcano_queues.get(pool.name)
    if queue:
        pg_spec["queue"] = queue
    return {
        "apiVersion": PODGROUP_API,
        "kind": "PodGroup",
        "metadata": {"name": request.name, "namespace": ns, "labels": dict(labels)},
        "spec": pg_spec,
    }


def token_secret(request: SubmitRequest, namespace: str, labels: dict[str, str],
                 token: str) -> dict[str, Any]:
    """The attempt's progress token. The adapter creates it before the Job and makes the Job
    its owner, so it goes with the Job; readable by whoever may read Secrets there, never by
    whoever may only read Jobs or pods."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": request.name, "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "immutable": True,
        "stringData": {SECRET_TOKEN_KEY: token},
    }


def labels_match(found: Mapping[str, str] | None, request: SubmitRequest) -> bool:
    """An existing object belongs to this attempt when its Isthmus labels are the same."""
    found = found or {}
    return all(found.get(k) == v for k, v in labels_for(request).items())
