"""Builders of Kubernetes API JSON (Job, Pod, Node) and submit requests for unit tests."""

from __future__ import annotations

from typing import Any

from backends.base import SubmitRequest
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec

T0 = "2026-01-01T00:00:00Z"
T5 = "2026-01-01T00:00:05Z"
T9 = "2026-01-01T00:00:09Z"
JOB_ID = "01abcdefghjkmnpq"
NAME = f"isthmus-{JOB_ID}-2"


def request(
    *,
    pool: str = "h100",
    level: str | None = None,
    domain: str | None = None,
    nodes: tuple[str, ...] = (),
    replicas: int = 4,
    gpus: int = 8,
    env: dict[str, str] | None = None,
    spec_env: dict[str, str] | None = None,
    job_id: str = JOB_ID,
    **spec: Any,
) -> SubmitRequest:
    data: dict[str, Any] = {
        "name": "train", "team": "vision",
        "gang": {"replicas": replicas, "gpus_per_replica": gpus},
        "flavors": ["h100-80g"],
        "entrypoint": {"image": "trainer:1", "command": ["python", "train.py"]},
        "max_runtime": "2h", "checkpoint": {"grace": 45}, "env": spec_env or {}, **spec,
    }
    placement = Placement(backend="k8s", backend_instance="k8s-local", pool=pool,
                          flavor="h100-80g", topology_level=level, topology_domain=domain,
                          nodes=nodes)
    return SubmitRequest(job_id=job_id, attempt=2, name=f"isthmus-{job_id}-2",
                         snapshot=RunSnapshot.of(JobSpec.model_validate(data)),
                         placement=placement, env=env or {"ISTHMUS_PROGRESS_TOKEN": "t0k"})


def job(replicas: int = 2, *, conditions: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None, suspend: bool = False,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": NAME, "uid": "u-1", "creationTimestamp": T0,
                            "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = T9
    return {"metadata": meta,
            "spec": {"parallelism": replicas, "completions": replicas, "suspend": suspend},
            "status": {"conditions": conditions or []}}


def cond(kind: str, reason: str = "", message: str = "", status: str = "True",
         at: str = T9) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": at}


def pod(index: int, phase: str = "Running", *, node: str | None = "n0",
        scheduled_at: str | None = T0, terminated: dict[str, Any] | None = None,
        waiting: str | None = None, conditions: list[dict[str, Any]] | None = None,
        deleting: bool = False, reason: str | None = None,
        gpus: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{NAME}-{index}-x",
        "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        "labels": labels or {},
    }
    if deleting:
        meta["deletionTimestamp"] = T9
    conds = list(conditions or [])
    if scheduled_at:
        conds.append(cond("PodScheduled", at=scheduled_at))
    state: dict[str, Any]
    if terminated is not None:
        state = {"terminated": {"startedAt": T0, "finishedAt": T5, **terminated}}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting, "message": "boom"}}
    elif phase == "Running":
        state = {"running": {"startedAt": T0}}
    else:
        state = {}
    status: dict[str, Any] = {"phase": phase, "conditions": conds,
                              "containerStatuses": [{"name": "trainer", "state": state}]
                              if state else []}
    if reason:
        status["reason"] = reason
    spec: dict[str, Any] = {"containers": [
        {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": status}
