"""Stopping gangs: `K8sBackend.cancel` (the Job deleted in the foreground, its pods with the
given grace, Service, Secret and PodGroup) and the teardown of a gang that cannot go on (the
Job annotated with the finding first, so that the verdict outlives the object, then deleted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.base import CancelResult
from backends.k8s.classify import teardown_annotation
from backends.k8s.client import ApiError, Apis, call, call_json
from backends.k8s.manifests import ANN_TEARDOWN, LABEL_NAME, PODGROUP_API
from broker.domain.facts import Fact, Finding
from broker.logs import get_logger

log = get_logger(__name__)


def cancel_gang(apis: Apis, name: str, grace_seconds: int, ns: str,
                podgroups: bool) -> CancelResult:
    """Delete the gang `name` in `ns`; running ranks get `grace_seconds` to stop."""
    pods = call_json("list pods", apis.core.list_namespaced_pod, ns,
                     label_selector=f"{LABEL_NAME}={name}",
                     timeout=apis.settings.request_timeout_s)
    running = [p for p in pods.get("items") or ()
               if (p.get("status") or {}).get("phase") == "Running"]
    found = delete_gang(apis, name, grace_seconds, ns, podgroups)
    found = found or bool(pods.get("items"))
    signalled = found and grace_seconds > 0 and bool(running)
    if not found:
        msg = f"{ns}/{name} not found"
    else:
        msg = (f"deleted Job {ns}/{name}; {len(running)} running rank(s) "
               f"stopped with {grace_seconds}s grace")
    return CancelResult(name, found=found, signalled=signalled, message=msg)


def tear_down(apis: Apis, job: Mapping[str, Any], finding: Finding, fact: Fact, ns: str,
              podgroups: bool) -> None:
    """Stop a gang that cannot go on; the annotation makes the finding durable."""
    meta = job.get("metadata") or {}
    name = str(meta.get("name", ""))
    failure = finding.failure or fact.failure
    assert failure is not None
    if meta.get("deletionTimestamp"):
        return
    if not (meta.get("annotations") or {}).get(ANN_TEARDOWN):
        note = teardown_annotation(failure, finding.raw_reason, finding.message)
        try:
            call("annotate Job", apis.batch.patch_namespaced_job, name,
                 ns, {"metadata": {"annotations": {ANN_TEARDOWN: note}}},
                 timeout=apis.settings.request_timeout_s,
                 _content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        log.warning("tearing down %s/%s: %s", ns, name, note)
    delete_gang(apis, name, None, ns, podgroups)


def delete_gang(apis: Apis, name: str, grace: int | None, ns: str, podgroups: bool) -> bool:
    """Delete the Job (foreground), its pods (with `grace` when given), the Service,
    Secret and (`podgroups`) PodGroup. True when the Job existed."""
    t = apis.settings.request_timeout_s
    found = True
    extra: dict[str, Any] = {} if grace is None else {"grace_period_seconds": grace}
    try:
        call("delete Job", apis.batch.delete_namespaced_job, name, ns, timeout=t,
             propagation_policy="Foreground", **extra)
    except ApiError as exc:
        if exc.status != 404:
            raise
        found = False
    if grace is not None:
        call("delete pods", apis.core.delete_collection_namespaced_pod, ns,
             label_selector=f"{LABEL_NAME}={name}", timeout=t, grace_period_seconds=grace)
    for what, delete in (("Service", apis.core.delete_namespaced_service),
                         ("Secret", apis.core.delete_namespaced_secret)):
        try:  # the Secret is the Job's too; deleted here as well, not left to the GC
            call(f"delete {what}", delete, name, ns, timeout=t)
        except ApiError as exc:
            if exc.status != 404:
                raise
    if podgroups:
        group, version = PODGROUP_API.split("/")
        try:
            call("delete PodGroup", apis.custom.delete_namespaced_custom_object,
                 group, version, ns, "podgroups", name, timeout=t)
        except ApiError as exc:
            if exc.status != 404:
                raise
    return found
