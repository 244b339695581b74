"""The Helm chart rendered with the real helm (no cluster): lint, objects, values checks, and
RBAC derived from the Kubernetes API calls the backend's source makes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config import parse_config
from tests.harness.helm import CHART, REPO, SITE_VALUES, Render, by_kind, one, run_helm

# Every Kubernetes API method the backend may call -> (api group, resource, verbs, scope).
# list_* methods feed the watch reflectors (backends/k8s/watch.py), hence "watch".
API_CALLS: dict[str, tuple[str, str, frozenset[str], str]] = {
    "create_namespaced_job": ("batch", "jobs", frozenset({"create"}), "ns"),
    "read_namespaced_job": ("batch", "jobs", frozenset({"get"}), "ns"),
    "list_namespaced_job": ("batch", "jobs", frozenset({"list", "watch"}), "ns"),
    "patch_namespaced_job": ("batch", "jobs", frozenset({"patch"}), "ns"),
    "delete_namespaced_job": ("batch", "jobs", frozenset({"delete"}), "ns"),
    "list_namespaced_pod": ("", "pods", frozenset({"list", "watch"}), "ns"),
    "delete_collection_namespaced_pod": ("", "pods", frozenset({"deletecollection"}), "ns"),
    "read_namespaced_pod_log": ("", "pods/log", frozenset({"get"}), "ns"),
    "create_namespaced_service": ("", "services", frozenset({"create"}), "ns"),
    "read_namespaced_service": ("", "services", frozenset({"get"}), "ns"),
    "delete_namespaced_service": ("", "services", frozenset({"delete"}), "ns"),
    "create_namespaced_secret": ("", "secrets", frozenset({"create"}), "ns"),
    "read_namespaced_secret": ("", "secrets", frozenset({"get"}), "ns"),
    "patch_namespaced_secret": ("", "secrets", frozenset({"patch"}), "ns"),
    "delete_namespaced_secret": ("", "secrets", frozenset({"delete"}), "ns"),
    "create_namespaced_custom_object": ("scheduling.volcano.sh", "podgroups",
                                        frozenset({"create"}), "volcano"),
    "get_namespaced_custom_object": ("scheduling.volcano.sh", "podgroups",
                                     frozenset({"get"}), "volcano"),
    "delete_namespaced_custom_object": ("scheduling.volcano.sh", "podgroups",
                                        frozenset({"delete"}), "volcano"),
    "list_node": ("", "nodes", frozenset({"list", "watch"}), "cluster"),
    "read_node": ("", "nodes", frozenset({"get"}), "cluster"),
    "list_pod_for_all_namespaces": ("", "pods", frozenset({"list"}), "cluster"),
    # only with per-team namespaces (settings namespace: "isthmus-{team}"): granted by the
    # chart's "-teams" ClusterRole, with the namespaced verbs and namespaces create
    "list_job_for_all_namespaces": ("batch", "jobs", frozenset({"list", "watch"}), "per-team"),
    # only with a pool in kueue mode: Kueue's Workloads (in the namespace; across namespaces
    # with per-team namespaces)
    "list_namespaced_custom_object": ("kueue.x-k8s.io", "workloads",
                                      frozenset({"list", "watch"}), "kueue"),
    "list_cluster_custom_object": ("kueue.x-k8s.io", "workloads",
                                   frozenset({"list", "watch"}), "kueue-per-team"),
}
# Called, but deliberately not granted in the Role: the backend treats a 403 as "the namespace
# is managed by someone else" (K8sBackend._ensure_namespace); the chart's users create the
# namespaces. Only per-team namespaces get it (the "-teams" ClusterRole).
NOT_GRANTED = {"create_namespace"}


def _backend_api_methods() -> set[str]:
    """Names of kubernetes client API methods that appear in backends/k8s/*.py."""
    from kubernetes import client

    apis = (client.CoreV1Api, client.BatchV1Api, client.CustomObjectsApi)
    known = {m for api in apis for m in dir(api) if not m.startswith("_")}
    words: set[str] = set()
    for path in (REPO / "backends" / "k8s").glob("*.py"):
        words |= set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", path.read_text()))
    return words & known


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def _needed(scope: set[str]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r, verbs, s in API_CALLS.values() if s in scope for v in verbs}


def test_lint_is_clean(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, ["lint", "--strict", str(CHART)], values=SITE_VALUES, tmp=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_rbac_grants_exactly_what_the_backend_calls(render: Render) -> None:
    called = _backend_api_methods()
    unknown = called - set(API_CALLS) - NOT_GRANTED
    assert not unknown, (f"backends/k8s calls {sorted(unknown)}: add them to API_CALLS and "
                         "grant them in deploy/helm/isthmus/templates/rbac.yaml")
    assert called >= set(API_CALLS) - {m for m, c in API_CALLS.items() if c[3] == "volcano"}
    objs = render()
    role = one(objs, "Role")
    assert role["metadata"]["namespace"] == "gpu-jobs"
    assert _grants(role["rules"]) == _needed({"ns"})  # nothing more, nothing less
    cluster = one(objs, "ClusterRole")
    assert _grants(cluster["rules"]) == _needed({"cluster"})
    # bound to the chart's ServiceAccount in the release namespace
    sa = one(objs, "ServiceAccount")["metadata"]
    for binding in (one(objs, "RoleBinding"), one(objs, "ClusterRoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"],
                                        "namespace": "isthmus-system"}]
    # Volcano's PodGroups only where a backend uses Volcano
    volcano = render({"config": {"backends": [
        {"name": "k8s", "kind": "k8s", "settings": {"namespace": "gpu-jobs",
                                                    "modes": {"a100": "volcano"}}}]}})
    assert _grants(one(volcano, "Role")["rules"]) == _needed({"ns", "volcano"})
    # Kueue's Workloads only where a backend uses Kueue
    kueue = render({"config": {"backends": [
        {"name": "k8s", "kind": "k8s", "settings": {"namespace": "gpu-jobs",
                                                    "modes": {"a100": "kueue"},
                                                    "kueue_queues": {"a100": "q"}}}]}})
    assert _grants(one(kueue, "Role")["rules"]) == _needed({"ns", "kueue"})


def test_roles_follow_the_namespaces_of_the_config(render: Render) -> None:
    objs = render({
        "config": {"backends": [
            {"name": "k8s", "kind": "k8s", "settings": {"namespace": "gpu-jobs"}},
            {"name": "k8s-default-ns", "kind": "k8s"},
            {"name": "other-cluster", "kind": "k8s",
             "settings": {"kubeconfig": "/etc/isthmus/other.kubeconfig", "namespace": "far"}},
            {"name": "slurm", "kind": "slurm", "settings": {"transport": "cli"}},
        ], "pools": []},
        "rbac": {"extraNamespaces": ["extra-jobs"]},
    })
    assert sorted(r["metadata"]["namespace"] for r in by_kind(objs, "Role")) == [
        "extra-jobs", "gpu-jobs", "isthmus"]
    assert sorted(r["metadata"]["namespace"] for r in by_kind(objs, "RoleBinding")) == [
        "extra-jobs", "gpu-jobs", "isthmus"]
    no_rbac = render({"rbac": {"create": False}})
    assert not by_kind(no_rbac, "Role") and not by_kind(no_rbac, "ClusterRole")


def test_the_configmap_is_the_whole_isthmus_yaml(render: Render) -> None:
    cm = one(render(), "ConfigMap")
    data = yaml.safe_load(cm["data"]["isthmus.yaml"])
    assert {k: data[k] for k in SITE_VALUES["config"]} == SITE_VALUES["config"]
    assert data["cohorts"] == []  # the chart's defaults fill the rest
    cfg = parse_config(data, "configmap")
    assert cfg.backends[0].settings["namespace"] == "gpu-jobs" and cfg.auth.mode == "token"
    # a changed configuration rolls the pods
    before = one(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    after = one(render({"config": {"teams": []}}), "Deployment")[
        "spec"]["template"]["metadata"]["annotations"]
    assert before["checksum/config"] != after["checksum/config"]


def test_the_deployment_runs_two_hardened_replicas(render: Render) -> None:
    objs = render()
    dep = one(objs, "Deployment")
    assert dep["metadata"]["namespace"] == "isthmus-system"
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    (c,) = pod["containers"]
    assert c["args"] == ["server", "--config", "/etc/isthmus/isthmus.yaml"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in c["env"]}
    assert env["ISTHMUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "isthmus-db", "key": "url"}
    assert env["ISTHMUS_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "isthmus-tokens", "key": "admin"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"/etc/isthmus", "/tmp"}  # the only writable path is /tmp
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    svc = one(objs, "Service")["spec"]
    assert svc["ports"][0]["targetPort"] == "http"
    assert svc["selector"] == spec["selector"]["matchLabels"]
    netpol = one(objs, "NetworkPolicy")["spec"]
    assert netpol["policyTypes"] == ["Ingress"]
    assert netpol["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    # one replica: no PodDisruptionBudget (it would block every node drain)
    assert not by_kind(render({"replicaCount": 1}), "PodDisruptionBudget")


def test_the_migration_hook_needs_only_the_database_secret(render: Render) -> None:
    objs = render()
    job = one(objs, "Job")
    # its pod is no API server: the Service, PDB and NetworkPolicy must not select it
    labels = job["spec"]["template"]["metadata"]["labels"]
    selector = one(objs, "Service")["spec"]["selector"]
    assert any(labels.get(k) != v for k, v in selector.items())
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    (c,) = pod["containers"]
    assert c["args"] == ["db", "upgrade"]
    assert [e["name"] for e in c["env"]] == ["ISTHMUS_DATABASE_URL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert not by_kind(render({"migrations": {"enabled": False}}), "Job")


def test_monitoring_objects_are_optional(render: Render) -> None:
    objs = render()
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "PrometheusRule")
    objs = render({"metrics": {"serviceMonitor": {"enabled": True},
                               "prometheusRule": {"enabled": True}}})
    sm = one(objs, "ServiceMonitor")["spec"]
    assert sm["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    rules = one(objs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {"IsthmusDown", "IsthmusControlLoopStalled",
                                           "IsthmusBackendUnreachable"}
    assert 'up{job="rel-isthmus"}' in rules[0]["expr"]
    assert "{{ $labels.backend }}" in next(
        r for r in rules if r["alert"] == "IsthmusBackendUnreachable")["annotations"]["summary"]


def test_alerts_use_metrics_the_broker_exports_and_are_documented(render: Render) -> None:
    from broker import metrics

    # collect() names families without the _total / _bucket / _count / _sum of their samples
    exported = {m.name for m in metrics.REGISTRY.collect()} | metrics.STORE_FAMILIES
    objs = render({"metrics": {"prometheusRule": {"enabled": True}}})
    rules = one(objs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    docs = (REPO / "docs" / "operations.md").read_text()
    for rule in rules:
        for name in re.findall(r"\bisthmus_[a-z_]+", rule["expr"]):
            family = re.sub(r"_(total|bucket|count|sum)$", "", name)
            assert name in exported or family in exported, f"{rule['alert']}: {name} unknown"
        assert f"`{rule['alert']}`" in docs, f"docs/operations.md: nothing on {rule['alert']}"


REFUSED: list[Any] = [
    pytest.param({"database": {"existingSecret": ""}}, "give database.existingSecret",
                 id="no-database"),
    pytest.param({"database": {"existingSecret": "", "url": "sqlite:////data/i.db"}},
                 "needs PostgreSQL", id="sqlite-with-two-replicas"),
    pytest.param({"config": {"database": "postgresql://u:p@db/i"}},
                 "leave the URL out of the ConfigMap", id="url-in-configmap"),
    pytest.param({"config": {"auth": {"mode": "none"}}}, "/config/auth/mode",
                 id="auth-none"),
    pytest.param({"config": {"server": {"host": "127.0.0.1"}}}, "use 0.0.0.0",
                 id="loopback-listener"),
    pytest.param({"database": {"url": "mysql://db/i"}}, "/database/url", id="bad-scheme"),
    pytest.param({"replicas": 3}, "additional properties 'replicas'", id="typo-key"),
    pytest.param({"podSecurityContext": {"runAsNonRoot": False}},
                 "/podSecurityContext/runAsNonRoot", id="root"),
]


@pytest.mark.parametrize(("values", "says"), REFUSED)
def test_bad_values_are_refused_with_the_field(
    helm: Path, tmp_path: Path, values: dict[str, Any], says: str
) -> None:
    from tests.harness.helm import KUBE_VERSION, merge

    proc = run_helm(helm, ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION],
                    values=merge(SITE_VALUES, values), tmp=tmp_path, check=False)
    assert proc.returncode != 0
    assert says in proc.stderr, proc.stderr


def test_per_team_namespaces_are_granted_cluster_wide(render: Render) -> None:
    objs = render({"config": {"backends": [
        {"name": "k8s", "kind": "k8s", "settings": {"namespace": "isthmus-{team}"}}],
        "pools": []}})
    assert not [r for r in by_kind(objs, "Role") if "{" in r["metadata"]["namespace"]]
    teams = [r for r in by_kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-teams")]
    assert len(teams) == 1
    assert _grants(teams[0]["rules"]) == _needed({"ns", "per-team"}) | {
        ("", "namespaces", "create")}
    (binding,) = [b for b in by_kind(objs, "ClusterRoleBinding")
                  if b["roleRef"]["name"] == teams[0]["metadata"]["name"]]
    assert binding["subjects"][0]["namespace"] == "isthmus-system"
    kueue = render({"config": {"backends": [
        {"name": "k8s", "kind": "k8s", "settings": {
            "namespace": "isthmus-{team}", "modes": {"a100": "kueue"},
            "kueue_queues": {"a100": "q"}}}], "pools": []}})
    (teams_kueue,) = [r for r in by_kind(kueue, "ClusterRole")
                      if r["metadata"]["name"].endswith("-teams")]
    assert _grants(teams_kueue["rules"]) == _needed({"ns", "per-team", "kueue-per-team"}) | {
        ("", "namespaces", "create")}
    one_ns = render()  # the default single namespace: no cluster-wide writes
    assert not [r for r in by_kind(one_ns, "ClusterRole")
                if r["metadata"]["name"].endswith("-teams")]
