"""Manifest rendering: the Indexed Job, headless Service and the kueue / volcano variants."""

from __future__ import annotations

from typing import Any

import pytest

from backends.base import Unsupported, masked
from backends.k8s.create import shown
from backends.k8s.manifests import render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from tests.harness.k8s_requests import JOB_ID, NAME, request

H100 = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})
SETTINGS = K8sSettings(namespace="train", all_ranks_timeout_s=120, master_port=29400)


def _job(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    return job


def _pod_spec(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _job(manifests)["spec"]["template"]["spec"]
    return spec


def _term(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    aff = _pod_spec(manifests)["affinity"]["nodeAffinity"]
    (term,) = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return dict(term)


def _env(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = _pod_spec(manifests)["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_indexed_gang_job_and_headless_service() -> None:
    out = render(request(), H100, SETTINGS)
    assert [m["kind"] for m in out] == ["Job", "Service", "Secret"]
    job, svc, _ = out
    assert job["metadata"]["name"] == svc["metadata"]["name"] == NAME
    assert job["metadata"]["namespace"] == "train"
    labels = {"isthmus.io/job": JOB_ID, "isthmus.io/attempt": "2",
              "isthmus.io/managed-by": "isthmus", "isthmus.io/name": NAME}
    assert job["metadata"]["labels"] == labels
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    assert svc["metadata"]["labels"] == labels
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"],
            spec["backoffLimit"]) == (4, 4, "Indexed", 0)
    assert spec["activeDeadlineSeconds"] == 7200 + 120
    assert "suspend" not in spec
    rules = spec["podFailurePolicy"]["rules"]
    assert [r["action"] for r in rules] == ["FailJob", "FailJob"]
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert rules[1]["onExitCodes"]["operator"] == "NotIn"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == NAME
    assert pod["terminationGracePeriodSeconds"] == 45
    (c,) = pod["containers"]
    assert c["image"] == "trainer:1" and c["command"] == ["python", "train.py"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"isthmus.io/name": NAME}
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_the_jobs_labels_go_on_every_object_and_ours_are_kept() -> None:
    mine = {"app.kubernetes.io/name": "llama", "example.com/run": "r1"}
    job, svc, _ = render(request(labels=mine), H100, SETTINGS)
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"],
                   svc["metadata"]["labels"]):
        assert labels.items() >= mine.items()
        assert labels["isthmus.io/job"] == JOB_ID and labels["isthmus.io/name"] == NAME
    assert svc["spec"]["selector"] == {"isthmus.io/name": NAME}


def test_torchrun_env() -> None:
    env = _env(render(request(env={"ISTHMUS_PROGRESS_TOKEN": "t", "FOO": "req"},
                              spec_env={"FOO": "spec", "MASTER_PORT": "1234",
                                        "WORLD_SIZE": "99"}), H100, SETTINGS))
    assert env["MASTER_ADDR"] == f"{NAME}-0.{NAME}"
    assert env["MASTER_PORT"] == "1234"  # the job may choose its port
    assert env["WORLD_SIZE"] == env["NNODES"] == "4"  # but not the world size
    assert env["GPUS_PER_NODE"] == "8"
    assert env["FOO"] == "req"  # the request's env wins over the spec's
    assert env["ISTHMUS_PROGRESS_TOKEN"] == {
        "secretKeyRef": {"name": NAME, "key": "progress-token"}}  # never the literal
    assert env["ISTHMUS_JOB_ID"] == JOB_ID and env["ISTHMUS_ATTEMPT"] == "2"
    ref = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["NODE_RANK"] == env["RANK"] == {"fieldRef": {"fieldPath": ref}}


def test_default_master_port_from_settings() -> None:
    assert _env(render(request(), H100, SETTINGS))["MASTER_PORT"] == "29400"


@pytest.mark.parametrize(("level", "domain", "key", "value"), [
    ("rack", "h100-block-0/h100-rack-1", "topology.isthmus.io/rack", "h100-rack-1"),
    ("block", "h100-block-0", "topology.isthmus.io/block", "h100-block-0"),
])
def test_affinity_pins_pool_and_topology_domain(level: str, domain: str, key: str,
                                                value: str) -> None:
    term = _term(render(request(level=level, domain=domain), H100, SETTINGS))
    assert term["matchExpressions"] == [
        {"key": "isthmus.io/pool", "operator": "In", "values": ["h100"]},
        {"key": key, "operator": "In", "values": [value]},
    ]
    assert "matchFields" not in term


def test_custom_topology_labels() -> None:
    settings = K8sSettings(rack_label="example.com/leaf")
    term = _term(render(request(level="rack", domain="b/r7"), H100, settings))
    assert term["matchExpressions"][-1] == {"key": "example.com/leaf", "operator": "In",
                                            "values": ["r7"]}


def test_affinity_to_chosen_nodes() -> None:
    term = _term(render(request(level="rack", domain="b/r", nodes=("n2", "n1", "n2")), H100,
                        SETTINGS))
    # several nodes: the hostname label, since matchFields on metadata.name takes one value
    assert "matchFields" not in term
    assert term["matchExpressions"] == [
        {"key": "isthmus.io/pool", "operator": "In", "values": ["h100"]},
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]},
    ]  # the nodes are tighter than the rack, which is not repeated


def test_a_node_per_replica_is_required_of_the_scheduler() -> None:
    """sbatch -N (gang.one_per_node): no two pods of the attempt on one node, by the pods'
    own job and attempt labels; a packable gang gets no such term."""
    spread = request(replicas=2, gpus=4, nodes=("n1", "n2"),
                     gang={"replicas": 2, "gpus_per_replica": 4, "one_per_node": True})
    anti = _pod_spec(render(spread, H100, SETTINGS))["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {"isthmus.io/job": JOB_ID,
                                                      "isthmus.io/attempt": "2"}},
                    "topologyKey": "kubernetes.io/hostname"}
    packed = request(replicas=2, gpus=4, nodes=("n1", "n1"))
    assert "podAntiAffinity" not in _pod_spec(render(packed, H100, SETTINGS))["affinity"]


def test_tolerations_for_the_pools_own_taint_and_node_loss() -> None:
    tols = _pod_spec(render(request(), H100, SETTINGS))["tolerations"]
    assert tols[0] == {"key": "isthmus.io/pool", "operator": "Equal", "value": "h100"}
    assert {t["key"] for t in tols[1:]} == {"node.kubernetes.io/not-ready",
                                            "node.kubernetes.io/unreachable"}
    assert all(t["tolerationSeconds"] == 60 for t in tols[1:])


def test_configured_tolerations_replace_the_default() -> None:
    settings = K8sSettings.from_dict({"tolerations": {"h100": [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}})
    tols = _pod_spec(render(request(), H100, settings))["tolerations"]
    assert tols[0] == {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert len(tols) == 3


def test_kueue_mode_creates_the_job_suspended_with_a_queue() -> None:
    settings = K8sSettings.from_dict({"modes": {"h100": "kueue"},
                                      "kueue_queues": {"h100": "team-a"}})
    out = render(request(level="rack", domain="b/h100-rack-1"), H100, settings)
    assert [m["kind"] for m in out] == ["Job", "Service", "Secret"]
    job = _job(out)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # Kueue picks the domain (topology-aware scheduling); Isthmus pins the pool only
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "topology.isthmus.io/rack",
        "isthmus.io/max-runtime": "7200"}
    assert len(_term(out)["matchExpressions"]) == 1
    # nor the nodes Isthmus's own placement chose: they would fight Kueue's choice
    out = render(request(level="rack", domain="b/h100-rack-1", nodes=("n1", "n2")), H100,
                 settings)
    assert len(_term(out)["matchExpressions"]) == 1


def test_volcano_mode_adds_a_podgroup() -> None:
    settings = K8sSettings.from_dict({"modes": {"h100": "volcano"},
                                      "volcano_queues": {"h100": "research"}})
    out = render(request(), H100, settings)
    assert [m["kind"] for m in out] == ["Job", "Service", "PodGroup", "Secret"]
    pg = out[2]
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert pg["metadata"]["name"] == NAME
    assert pg["spec"] == {"minMember": 4, "minResources": {"nvidia.com/gpu": "32"},
                          "queue": "research"}
    pod = _pod_spec(out)
    assert pod["schedulerName"] == "volcano"
    tmpl = _job(out)["spec"]["template"]["metadata"]
    assert tmpl["annotations"]["scheduling.k8s.io/group-name"] == NAME


def test_script_entrypoint_runs_in_bash_and_mounts_are_claims() -> None:
    out = render(request(entrypoint={"image": "img:1", "script": "echo hi"},
                         mounts=[{"name": "imagenet", "path": "/data"}]), H100, SETTINGS)
    pod = _pod_spec(out)
    (c,) = pod["containers"]
    assert c["command"] == ["/bin/bash", "-c", "echo hi"]
    assert c["volumeMounts"] == [{"name": "data-0", "mountPath": "/data", "readOnly": True}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "imagenet",
                                                          "readOnly": True}


def test_cpu_and_memory_requests() -> None:
    out = render(request(gang={"replicas": 2, "gpus_per_replica": 4, "cpus_per_replica": 32,
                               "memory_per_replica": "256Gi"}), H100, SETTINGS)
    (c,) = _pod_spec(out)["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "cpu": "32",
                                        "memory": str(256 * 2**30)}
    assert c["resources"]["requests"] == {"cpu": "32", "memory": str(256 * 2**30)}


def test_no_image_is_refused() -> None:
    with pytest.raises(Unsupported, match="image"):
        render(request(entrypoint={"script": "echo hi"}), H100, SETTINGS)


def test_render_is_deterministic() -> None:
    assert render(request(), H100, SETTINGS) == render(request(), H100, SETTINGS)


@pytest.mark.parametrize(("data", "match"), [
    ({"bogus": 1}, "unknown k8s backend setting"),
    ({"modes": {"h100": "slurm"}}, "must be one of"),
    ({"modes": {"h100": "kueue"}}, "kueue_queues"),
    ({"all_ranks_timeout_s": 0}, "all_ranks_timeout_s"),
])
def test_bad_settings_name_the_key(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        K8sSettings.from_dict(data)


@pytest.mark.parametrize("mode", ["plain", "volcano"])
def test_what_submit_returns_is_the_render_of_the_masked_request(mode: str) -> None:
    """create.shown (what K8sBackend.submit returns of the manifests it sent) is what
    `render` of the masked request gives, and leaves the manifests to send as they were."""
    settings = K8sSettings.from_dict({"modes": {"h100": mode}})
    req = request(env={"ISTHMUS_PROGRESS_TOKEN": "s3cret"})
    sent = render(req, H100, settings)
    before = repr(sent)
    out = shown(sent)
    assert out == render(masked(req), H100, settings)
    assert "s3cret" not in repr(out) and "s3cret" in before and repr(sent) == before
