"""Creating the objects of one gang (`K8sBackend.submit`): the team's namespace on first use,
the Secret of the progress token, then the Job (which then owns the Secret), Service and
PodGroup. A 409 adopts the existing object when its Isthmus labels match, else the request is
refused. The manifests given are never changed: they are what was rendered."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

from backends.base import MASK, SubmitRequest, SubmitResult, Unsupported
from backends.k8s.client import ApiError, Apis, call, call_json
from backends.k8s.manifests import LABEL_MANAGED, LABEL_TEAM, PODGROUP_API, labels_match
from backends.k8s.settings import MANAGED_BY
from broker.logs import get_logger

log = get_logger(__name__)
JSON = dict[str, Any]


def ensure_namespace(apis: Apis, ready: set[str], ns: str, team: str) -> None:
    """Create the namespace `ns` (once per adapter; when the settings ask for it)."""
    settings = apis.settings
    if ns in ready or not settings.create_namespace:
        return
    labels = {LABEL_MANAGED: MANAGED_BY}
    if settings.per_team:
        labels[LABEL_TEAM] = team
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": labels}}
    try:
        call("create namespace", apis.core.create_namespace, body,
             timeout=settings.request_timeout_s)
    except ApiError as exc:
        if exc.status not in (409, 403):
            raise Unsupported(f"namespace {ns}: {exc.reason}") from None
    ready.add(ns)


def create_gang(apis: Apis, request: SubmitRequest, manifests: Sequence[JSON]) -> SubmitResult:
    """Create (or adopt) every object of `manifests` in the Job's namespace, in order."""
    timeout = apis.settings.request_timeout_s
    sent = copy.deepcopy(list(manifests))
    job = next(m for m in sent if m["kind"] == "Job")
    ns = str(job["metadata"]["namespace"])
    secrets = [m for m in sent if m["kind"] == "Secret"]
    rest = [m for m in sent if m["kind"] not in ("Job", "Secret")]
    for secret in secrets:  # before the Job: its pods read the token from it
        _create(apis, request, secret, ns)
    created, adopted = _create(apis, request, job, ns)
    uid = str((created.get("metadata") or {}).get("uid", ""))
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": request.name, "uid": uid,
             "controller": False, "blockOwnerDeletion": True}
    for secret in secrets:  # owned by the Job, so the garbage collector takes it along
        call("own Secret", apis.core.patch_namespaced_secret,
             secret["metadata"]["name"],
             ns, {"metadata": {"ownerReferences": [owner]}},
             timeout=timeout, _content_type="application/merge-patch+json")
    for manifest in rest:
        manifest["metadata"]["ownerReferences"] = [owner]
        _, was_there = _create(apis, request, manifest, ns)
        adopted = adopted or was_there
    verb = "adopted" if adopted else "created"
    log.info("%s %s/%s (%s)", verb, ns, request.name, uid)
    return SubmitResult(request.name, uid, adopted=adopted, rendered=shown(manifests))


def shown(manifests: Sequence[JSON]) -> list[JSON]:
    """The manifests as people may see them: the Secrets' values masked (what `render` of
    the masked request gives)."""
    out = copy.deepcopy(list(manifests))
    for m in out:
        if m["kind"] == "Secret":
            m["stringData"] = {k: MASK for k in m.get("stringData") or {}}
    return out


def _create(apis: Apis, request: SubmitRequest, manifest: JSON, ns: str) -> tuple[JSON, bool]:
    kind = manifest["kind"]
    timeout = apis.settings.request_timeout_s
    create, read = _verbs(apis, kind, ns)
    try:
        return call_json(f"create {kind}", create, body=manifest, timeout=timeout), False
    except ApiError as exc:
        if exc.status != 409:
            raise Unsupported(f"{kind} {request.name}: the API server refused it: "
                              f"{exc}") from None
    existing = call_json(f"read {kind}", read, name=request.name, timeout=timeout)
    labels = (existing.get("metadata") or {}).get("labels") or {}
    if not labels_match(labels, request):
        raise Unsupported(
            f"{kind} {ns}/{request.name} already exists and is not this "
            f"attempt's (labels {dict(labels)}); delete it or pick another namespace")
    return existing, True


def _verbs(apis: Apis, kind: str, ns: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    if kind == "Job":
        b = apis.batch
        return (functools.partial(b.create_namespaced_job, ns),
                functools.partial(b.read_namespaced_job, namespace=ns))
    if kind == "Service":
        c = apis.core
        return (functools.partial(c.create_namespaced_service, ns),
                functools.partial(c.read_namespaced_service, namespace=ns))
    if kind == "Secret":
        c = apis.core
        return (functools.partial(c.create_namespaced_secret, ns),
                functools.partial(c.read_namespaced_secret, namespace=ns))
    if kind == "PodGroup":
        group, version = PODGROUP_API.split("/")
        cu = apis.custom
        return (functools.partial(cu.create_namespaced_custom_object, group, version, ns,
                                  "podgroups"),
                functools.partial(cu.get_namespaced_custom_object, group, version, ns,
                                  "podgroups"))
    raise Unsupported(f"cannot create a {kind}")
