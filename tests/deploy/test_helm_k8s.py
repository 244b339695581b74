"""The chart on the real local control plane (deploy/testenv/k8s): server-side dry run, a real
install and upgrade, and its RBAC proven with the chart's own ServiceAccount token.

The fake nodes run no containers: the pods of the release are scheduled and played by kwok, so
these tests check objects and the apiserver's answers, never processes. The release's pods go
to a node of their own (tainted for them), so the shared GPU nodes are not touched except by
the backend's one-GPU gang below.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from backends.k8s import K8sBackend
from broker.config import Backend as BackendConfig
from broker.config import Pool, parse_config
from broker.domain.facts import Fact, Phase
from broker.wiring.adapters import k8s_adapter
from tests.fixtures.k8s import FAKE_DURATION, K8sCluster, as_dict
from tests.harness.helm import CHART, KUBE_VERSION, SITE_VALUES, merge, run_helm
from tests.harness.k8s_requests import request
from tests.harness.kube_objects import gpu_node, new_job_id
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s


@dataclass
class Release:
    name: str
    namespace: str  # the release's
    jobs_namespace: str  # where the backend creates gangs
    node: str  # where the release's pods run
    values: dict[str, Any]
    helm: Path
    cluster: K8sCluster
    tmp: Path

    def helm_(self, *args: str, values: dict[str, Any] | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_helm(self.helm, [*args, "--kubeconfig", str(self.cluster.kubeconfig)],
                        values=values, tmp=self.tmp, check=check)

    @property
    def fullname(self) -> str:
        return f"{self.name}-isthmus"

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"


def _values(jobs_ns: str, node_pool: str) -> dict[str, Any]:
    return merge(SITE_VALUES, {
        "config": {"backends": [{"name": "k8s-local", "kind": "k8s", "settings": {
            "namespace": jobs_ns, "create_namespace": False}}],
            "pools": [{"name": "a100", "backend": "k8s-local", "flavor": "a100-80g",
                       "node_selector": {"isthmus.io/pool": "a100"}}]},
        "nodeSelector": {"isthmus.io/pool": node_pool},
        "tolerations": [{"key": "isthmus.io/pool", "operator": "Equal", "value": node_pool,
                         "effect": "NoSchedule"}],
    })


@pytest.fixture(scope="module")
def release(helm: Path, k8s_cluster: K8sCluster,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    ns = k8s_cluster.create_namespace(f"isthmus-rel-{suffix}")
    jobs_ns = k8s_cluster.create_namespace(f"isthmus-gangs-{suffix}")
    pool = f"ctl{suffix}"
    core = k8s_cluster.core()
    node = gpu_node(f"isthmus-ctl-{suffix}", pool, f"{pool}-rack-0", gpus=0)
    core.create_node(node)  # type: ignore[arg-type]
    for name, key, value in (("isthmus-db", "url", "postgresql://isthmus:pw@db.invalid/isthmus"),
                             ("isthmus-tokens", "admin", "adm1n-t0ken")):
        core.create_namespaced_secret(ns, {"metadata": {"name": name},  # type: ignore[arg-type]
                                           "stringData": {key: value}})
    rel = Release(name="rel", namespace=ns, jobs_namespace=jobs_ns,
                  node=node["metadata"]["name"], values=_values(jobs_ns, pool), helm=helm,
                  cluster=k8s_cluster, tmp=tmp_path_factory.mktemp("helm"))
    try:
        rel.helm_("install", rel.name, str(CHART), "-n", ns, "--wait", "--timeout", "120s",
                  values=rel.values)
        yield rel
    finally:
        rel.helm_("uninstall", rel.name, "-n", ns, "--wait", "--timeout", "60s", check=False)
        for n in (ns, jobs_ns):
            k8s_cluster.delete_namespace(n)
        try:
            core.delete_node(rel.node)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def test_the_rendered_chart_passes_a_server_side_dry_run(
    helm: Path, k8s_cluster: K8sCluster, tmp_path: Path
) -> None:
    ns = k8s_cluster.create_namespace("isthmus-dry")
    jobs = k8s_cluster.create_namespace("isthmus-dry-gangs")
    try:
        values = merge(_values(jobs, "nowhere"), {"rbac": {"extraNamespaces": [ns]}})
        out = run_helm(helm, ["template", "dry", str(CHART), "-n", ns, "--kube-version",
                              KUBE_VERSION], values=values, tmp=tmp_path).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        applied = k8s_cluster.kubectl(["apply", "--dry-run=server", "-o", "name", "-f", "-"],
                                      input=out).stdout.split()
        assert len(applied) == len(docs)
        assert {a.split("/")[0] for a in applied} == {
            "networkpolicy.networking.k8s.io", "poddisruptionbudget.policy", "serviceaccount",
            "configmap", "clusterrole.rbac.authorization.k8s.io",
            "clusterrolebinding.rbac.authorization.k8s.io", "role.rbac.authorization.k8s.io",
            "rolebinding.rbac.authorization.k8s.io", "service", "deployment.apps", "job.batch"}
        # a dry run stores nothing
        gone = k8s_cluster.kubectl(["-n", ns, "get", "deployment", "dry-isthmus"], check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
    finally:
        k8s_cluster.delete_namespace(ns)
        k8s_cluster.delete_namespace(jobs)


def test_install_creates_every_object_and_runs_the_migration_hook(release: Release) -> None:
    api = release.cluster.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns, name = release.namespace, release.fullname
    status = yaml.safe_load(release.helm_("status", release.name, "-n", ns, "-o", "yaml").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    dep = as_dict(apps.read_namespaced_deployment(name, ns))
    assert dep["spec"]["replicas"] == 2 and dep["status"]["availableReplicas"] == 2
    selector = as_dict(core.read_namespaced_service(name, ns))["spec"]["selector"]
    pods = as_dict(core.list_namespaced_pod(
        ns, label_selector=",".join(f"{k}={v}" for k, v in selector.items())))["items"]
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {release.node}
    assert all(p["spec"]["serviceAccountName"] == name for p in pods)
    cm = as_dict(core.read_namespaced_config_map(name, ns))
    cfg = parse_config(yaml.safe_load(cm["data"]["isthmus.yaml"]))
    assert cfg.backends[0].settings["namespace"] == release.jobs_namespace
    assert as_dict(core.read_namespaced_service(name, ns))["spec"]["ports"][0]["port"] == 8080
    core.read_namespaced_service_account(name, ns)
    pdb = as_dict(client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(name, ns))
    assert pdb["spec"]["minAvailable"] == 1
    client.NetworkingV1Api(api).read_namespaced_network_policy(name, ns)
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.read_namespaced_role(f"{name}-backend", release.jobs_namespace)
    rbac.read_namespaced_role_binding(f"{name}-backend", release.jobs_namespace)
    rbac.read_cluster_role(f"{name}-{ns}-inventory")
    # the pre-install hook ran `isthmus db upgrade` (played by kwok: it completed)
    hook = as_dict(client.BatchV1Api(api).read_namespaced_job(f"{name}-db-upgrade", ns))
    assert hook["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]
    assert hook["status"].get("succeeded") == 1
    api.close()


def test_upgrade_reruns_the_migration_and_rolls_the_pods(release: Release) -> None:
    api = release.cluster.api_client()
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    ns, name = release.namespace, release.fullname
    hook_before = as_dict(batch.read_namespaced_job(f"{name}-db-upgrade", ns))
    template_before = as_dict(apps.read_namespaced_deployment(name, ns))["spec"]["template"]
    values = merge(release.values, {"config": {"teams": [
        {"name": "vision", "quotas": {"a100-80g": {"nominal": 32}}}]}})
    release.helm_("upgrade", release.name, str(CHART), "-n", ns, "--wait", "--timeout", "120s",
                  values=values)
    release.values = values
    hook_after = as_dict(batch.read_namespaced_job(f"{name}-db-upgrade", ns))
    assert hook_after["metadata"]["uid"] != hook_before["metadata"]["uid"]
    assert hook_after["status"].get("succeeded") == 1
    dep = as_dict(apps.read_namespaced_deployment(name, ns))
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["checksum/config"] != template_before["metadata"]["annotations"]["checksum/config"]
    wait_until(lambda: (d := as_dict(apps.read_namespaced_deployment(name, ns)))["status"].get(
        "updatedReplicas") == 2 and d["status"].get("availableReplicas") == 2,
        timeout=60, what="the rolled replicas")
    api.close()


def test_control_separate_installs_a_control_deployment(release: Release) -> None:
    """A second release beside the first, with the control loop in its own Deployment: the
    apiserver takes every object, and the control pods (played by kwok: no process, no lease
    here; tests/deploy/test_helm_control.py runs the rendered command) are scheduled where the
    release's pods go, under the chart's ServiceAccount."""
    api = release.cluster.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns, name = release.namespace, "ctl-isthmus"
    values = merge(release.values, {"control": {"separate": True}})
    try:
        release.helm_("install", "ctl", str(CHART), "-n", ns, "--wait", "--timeout", "180s",
                      values=values)
        control = as_dict(apps.read_namespaced_deployment(f"{name}-control", ns))
        assert control["status"].get("availableReplicas") == 2
        assert control["spec"]["template"]["spec"]["containers"][0]["args"][0] == "control"
        server = as_dict(apps.read_namespaced_deployment(name, ns))
        assert server["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--no-control"
        pods = as_dict(core.list_namespaced_pod(ns, label_selector=(
            "app.kubernetes.io/instance=ctl,app.kubernetes.io/component=control")))["items"]
        assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {release.node}
        assert {p["spec"]["serviceAccountName"] for p in pods} == {name}
        svc = as_dict(core.read_namespaced_service(f"{name}-control", ns))["spec"]
        assert svc["clusterIP"] == "None" and svc["ports"][0]["name"] == "metrics"
        client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(f"{name}-control", ns)
        client.NetworkingV1Api(api).read_namespaced_network_policy(f"{name}-control", ns)
    finally:
        release.helm_("uninstall", "ctl", "-n", ns, "--wait", "--timeout", "60s", check=False)
        api.close()


# -- the chart's RBAC, with the chart's own identity ----------------------------------------


@pytest.fixture
def sa_api(release: Release) -> Iterator[client.ApiClient]:
    """An API client authenticated as the chart's ServiceAccount (a TokenRequest token, what
    the pods get), not the admin."""
    core = release.cluster.core()
    tr = core.create_namespaced_service_account_token(
        release.fullname, release.namespace,
        {"spec": {"expirationSeconds": 600}})  # type: ignore[arg-type]
    cfg = client.Configuration()
    cfg.host = release.cluster.api_url
    cfg.ssl_ca_cert = str(release.cluster.state_dir / "pki" / "ca.crt")
    assert tr.status is not None
    cfg.api_key = {"authorization": f"Bearer {tr.status.token}"}
    with client.ApiClient(cfg) as api:
        who = as_dict(client.AuthenticationV1Api(api).create_self_subject_review({}))  # type: ignore[arg-type]  # a dict is a body too
        assert who["status"]["userInfo"]["username"] == release.service_account
        yield api


def _wait_fact(backend: K8sBackend, name: str, ok: Callable[[Fact], bool]) -> Fact:
    def probe() -> Fact | None:
        fact = next((f for f in backend.observe([name]) if f.backend_name == name), None)
        return fact if fact is not None and ok(fact) else None

    return wait_until(probe, timeout=60, interval=0.3, what=f"a fact on {name}")


def test_the_backend_works_with_the_charts_service_account(
    release: Release, sa_api: client.ApiClient
) -> None:
    cfg = BackendConfig(name="k8s-local", kind="k8s", settings={
        "namespace": release.jobs_namespace, "create_namespace": True,
        "pod_annotations": {FAKE_DURATION: "never"}})
    pools = [Pool(name="a100", backend="k8s-local", flavor="a100-80g",
                  node_selector={"isthmus.io/pool": "a100"})]
    backend = k8s_adapter(cfg, pools, api_client=sa_api)
    try:
        # inventory: nodes (watched) and every namespace's pods, cluster-wide reads
        a100 = backend.inventory().pool("a100")
        assert a100 is not None and len(a100.nodes) >= 8 and a100.total_gpus >= 64
        # submit: the namespace exists already (create refused by RBAC, tolerated), Job +
        # Service created; observe through the Job and Pod watches; lookup reads them back
        req = request(pool="a100", replicas=2, gpus=1, job_id=new_job_id())
        result = backend.submit(req)
        assert not result.adopted and result.backend_id
        assert _wait_fact(backend, req.name, lambda f: f.phase is Phase.RUNNING).nodes
        assert backend.submit(req).adopted  # a second submit reads the objects back
        found = backend.lookup(req.name)
        assert found is not None and found.backend_id == result.backend_id
        # cancel: pods deleted as a collection with grace, Job and Service deleted
        cancelled = backend.cancel(req.name, 1)
        assert cancelled.found and cancelled.signalled, cancelled
        wait_until(lambda: all(f.backend_name != req.name for f in backend.observe()),
                   timeout=60, what="the gang to be gone")
    finally:
        backend.close()


REFUSED: list[Any] = [
    pytest.param(lambda c, r: c.delete_node(r.node, dry_run="All"), id="delete-a-node"),
    pytest.param(lambda c, r: c.patch_node(r.node, {"spec": {"unschedulable": True}},
                                           dry_run="All"), id="cordon-a-node"),
    pytest.param(lambda c, r: c.list_namespaced_secret("kube-system"),
                 id="secrets-in-another-namespace"),
    pytest.param(lambda c, r: c.list_namespaced_secret(r.namespace),
                 id="secrets-in-its-own-namespace"),
    pytest.param(lambda c, r: c.read_namespaced_secret("isthmus-db", r.namespace),
                 id="read-the-database-secret"),
    pytest.param(lambda c, r: c.list_namespaced_secret(r.jobs_namespace),
                 id="secrets-in-the-gang-namespace"),
    pytest.param(lambda c, r: c.create_namespaced_pod(r.jobs_namespace, {
        "metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}},
        dry_run="All"), id="create-a-bare-pod"),
    pytest.param(lambda c, r: c.delete_namespace(r.jobs_namespace, dry_run="All"),
                 id="delete-a-namespace"),
    pytest.param(lambda c, r: c.list_namespace(), id="list-namespaces"),
    pytest.param(lambda c, r: client.BatchV1Api(c.api_client).create_namespaced_job(
        "default", {"metadata": {"name": "x"}, "spec": {"template": {"spec": {  # type: ignore[arg-type]
            "restartPolicy": "Never", "containers": [{"name": "x", "image": "x"}]}}}},
        dry_run="All"), id="create-a-job-outside-its-namespaces"),  # the body may be a dict
    pytest.param(lambda c, r: client.RbacAuthorizationV1Api(c.api_client).create_cluster_role(
        {"metadata": {"name": "x"}, "rules": []}, dry_run="All"),  # type: ignore[arg-type]
        id="escalate-with-rbac"),
]


@pytest.mark.parametrize("action", REFUSED)
def test_the_apiserver_refuses_what_the_role_does_not_grant(
    release: Release, sa_api: client.ApiClient, action: Any
) -> None:
    with pytest.raises(client.ApiException) as err:
        action(client.CoreV1Api(sa_api), release)
    assert err.value.status == 403, err.value
    assert release.service_account in str(err.value.body)
