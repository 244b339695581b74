"""Whole gangs as the API server returns them (for the unit tests of the watch caches and the
bench of their size): the Job rendered by backends/k8s/manifests.py from a request with a
script-sized command, its pods, statuses of a running or finished gang, and `managedFields`
shaped like the server's (one entry per field manager, a FieldsV1 tree mirroring the object).
Plus a fake list API over such objects, for `Reflector.relist`."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from backends.k8s.manifests import COMPLETION_INDEX, render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from backends.k8s.watch import Reflector
from tests.harness.k8s_requests import request

JSON = dict[str, Any]
POOL = K8sPoolBinding("h100", "h100-80g", {"isthmus.io/pool": "h100"})
SCRIPT = "\n".join(
    ["set -euo pipefail", 'cd "$WORKDIR"']
    + [f"python -m train.stage{i} --config configs/run.yaml --shard $RANK --seed {i} "
       f"--out /ckpt/run/stage{i} --log-every 50 --resume-from /ckpt/run/stage{i - 1}"
       for i in range(1, 25)])
"""About 3 KB: a training launcher script, as teams send them."""


def stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields(obj: Any) -> Any:
    """A FieldsV1 tree over `obj` (keys as the server writes them; lists as one item)."""
    if isinstance(obj, dict):
        return {f"f:{k}": _fields(v) for k, v in obj.items()}
    if isinstance(obj, list) and obj:
        return {'k:{"name":"x"}': _fields(obj[0])} if isinstance(obj[0], dict) else {}
    return {}


def managed(obj: JSON, at: datetime, *managers: str) -> list[JSON]:
    return [{"manager": m, "operation": "Update", "apiVersion": obj.get("apiVersion", "v1"),
             "time": stamp(at), "fieldsType": "FieldsV1",
             "fieldsV1": _fields({"metadata": obj.get("metadata"), "spec": obj.get("spec")}
                                 if i == 0 else {"status": obj.get("status")}),
             **({"subresource": "status"} if i else {})}
            for i, m in enumerate(managers)]


def gang(job_id: str, *, namespace: str, started: datetime, finished: datetime | None = None,
         replicas: int = 2, team: str = "vision", managed_fields: bool = True
         ) -> tuple[JSON, list[JSON]]:
    """(Job, pods) of one gang: Running ranks when `finished` is None, else Complete then."""
    req = request(pool="h100", replicas=replicas, gpus=8, job_id=job_id, team=team,
                  entrypoint={"image": "registry.example/trainer:2026.11",
                              "command": ["/bin/bash", "-c", SCRIPT]})
    job = next(m for m in render(req, POOL, K8sSettings()) if m["kind"] == "Job")
    uid = f"uid-{job_id}"
    job["metadata"].update(namespace=namespace, uid=uid, resourceVersion="12345",
                           creationTimestamp=stamp(started), generation=1)
    status: JSON = {"startTime": stamp(started), "active": replicas, "ready": replicas}
    if finished is not None:
        done = [{"type": t, "status": "True", "reason": r, "message": m,
                 "lastProbeTime": stamp(finished), "lastTransitionTime": stamp(finished)}
                for t, r, m in (("SuccessCriteriaMet", "CompletionsReached",
                                 "Reached expected number of succeeded pods"),
                                ("Complete", "CompletionsReached",
                                 "Reached expected number of succeeded pods"))]
        status = {"startTime": stamp(started), "completionTime": stamp(finished),
                  "succeeded": replicas, "ready": 0, "conditions": done,
                  "completedIndexes": f"0-{replicas - 1}", "uncountedTerminatedPods": {}}
    job["status"] = status
    pods = [_pod(job, i, started, finished) for i in range(replicas)]
    if managed_fields:
        job["metadata"]["managedFields"] = managed(job, started, "isthmus",
                                                   "kube-controller-manager")
        for p in pods:
            p["metadata"]["managedFields"] = managed(p, started, "kube-controller-manager",
                                                     "kubelet")
    return job, pods


def _pod(job: JSON, i: int, started: datetime, finished: datetime | None) -> JSON:
    name = job["metadata"]["name"]
    tmpl = job["spec"]["template"]
    spec = copy.deepcopy(tmpl["spec"])
    spec.update(nodeName=f"h100-node-{i}", hostname=f"{name}-{i}", serviceAccountName="default")
    state: JSON = ({"terminated": {"exitCode": 0, "reason": "Completed",
                                   "startedAt": stamp(started), "finishedAt": stamp(finished)}}
                   if finished is not None else {"running": {"startedAt": stamp(started)}})
    at = stamp(started)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{name}-{i}-x7k2p", "namespace": job["metadata"]["namespace"],
            "uid": f"{job['metadata']['uid']}-{i}", "resourceVersion": "12346",
            "creationTimestamp": at, "generateName": f"{name}-{i}-",
            "labels": {**tmpl["metadata"].get("labels", {}), "batch.kubernetes.io/job-name": name,
                       "controller-uid": job["metadata"]["uid"], COMPLETION_INDEX: str(i)},
            "annotations": {**tmpl["metadata"].get("annotations", {}), COMPLETION_INDEX: str(i)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                 "uid": job["metadata"]["uid"], "controller": True,
                                 "blockOwnerDeletion": True}],
            "finalizers": ["batch.kubernetes.io/job-tracking"] if finished is None else [],
        },
        "spec": spec,
        "status": {
            "phase": "Succeeded" if finished is not None else "Running",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": at}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                                     "ContainersReady", "PodScheduled")],
            "hostIP": "10.0.0.1", "podIP": f"10.1.0.{i + 2}", "startTime": at,
            "containerStatuses": [{"name": "trainer", "state": state, "ready": finished is None,
                                   "restartCount": 0, "started": finished is None,
                                   "image": "registry.example/trainer:2026.11",
                                   "imageID": "registry.example/trainer@sha256:" + "ab" * 32,
                                   "containerID": "containerd://" + "cd" * 32}],
            "qosClass": "Guaranteed",
        },
    }


class Listing:
    """A generated list method's raw answer (`_preload_content=False`): `.data` bytes."""

    def __init__(self, items: Iterable[JSON]) -> None:
        self.data = json.dumps({"metadata": {"resourceVersion": "100"},
                                "items": list(items)}).encode()


def lister(items: Callable[[], Iterable[JSON]]) -> Callable[..., Listing]:
    """A list method answering `items()` (as they are at each call)."""
    return lambda *args, **kwargs: Listing(items())


def filled(kind: str, items: Iterable[JSON]) -> Reflector:
    """A reflector listed once from `items` (healthy, no watch thread)."""
    objects = list(items)
    reflector = Reflector(kind, lister(lambda: objects))
    reflector.relist()
    return reflector


def ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
