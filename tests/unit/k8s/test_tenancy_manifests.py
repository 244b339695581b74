"""Tenancy in the rendered objects: the admin's pod metadata wins over the job's, and the
progress token travels in a per-attempt Secret, never as a literal on the Job."""

from __future__ import annotations

from typing import Any

from backends.k8s.manifests import render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from tests.harness.k8s_requests import NAME, request

H100 = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})


def _pod_meta(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    meta: dict[str, Any] = job["spec"]["template"]["metadata"]
    return meta


def test_admin_pod_labels_and_annotations_win_over_the_jobs() -> None:
    settings = K8sSettings(namespace="train",
                           pod_labels={"example.com/tier": "batch"},
                           pod_annotations={"example.com/inject": "false"})
    out = render(request(labels={"example.com/tier": "gold", "example.com/run": "r1"},
                         annotations={"example.com/inject": "true", "note": "x"}),
                 H100, settings)
    meta = _pod_meta(out)
    assert meta["labels"]["example.com/tier"] == "batch"
    assert meta["labels"]["example.com/run"] == "r1"  # the job's own keys stay
    assert meta["annotations"]["example.com/inject"] == "false"
    assert meta["annotations"]["note"] == "x"
    assert meta["labels"]["isthmus.io/name"] == NAME


def test_progress_token_is_a_secret_reference_not_a_literal() -> None:
    out = render(request(env={"ISTHMUS_PROGRESS_TOKEN": "s3cr3t"}), H100,
                 K8sSettings(namespace="train"))
    (job,) = [m for m in out if m["kind"] == "Job"]
    (secret,) = [m for m in out if m["kind"] == "Secret"]
    assert "s3cr3t" not in repr(job)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    (tok,) = [e for e in c["env"] if e["name"] == "ISTHMUS_PROGRESS_TOKEN"]
    assert tok == {"name": "ISTHMUS_PROGRESS_TOKEN",
                   "valueFrom": {"secretKeyRef": {"name": NAME, "key": "progress-token"}}}
    assert secret["metadata"]["name"] == NAME
    assert secret["metadata"]["namespace"] == "train"
    assert secret["metadata"]["labels"]["isthmus.io/name"] == NAME
    assert secret["stringData"] == {"progress-token": "s3cr3t"}


def test_no_token_no_secret() -> None:
    out = render(request(env={"FOO": "1"}), H100, K8sSettings())
    assert [m["kind"] for m in out] == ["Job", "Service"]
