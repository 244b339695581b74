"""The chart's `control.separate`: the control loop in a Deployment of its own (`isthmus control`)
beside API servers run with `--no-control`. Rendered with the real helm; the rendered control
command is run for real on PostgreSQL; the alerts on the control pods run in promtool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import typer.main
import yaml

from broker.cli.main import app
from tests.fixtures import promtool
from tests.harness.helm import (
    CHART,
    KUBE_VERSION,
    REPO,
    SITE_VALUES,
    Render,
    by_kind,
    merge,
    one,
    run_helm,
)
from tests.harness.paths import ROOT
from tests.harness.server import FAST_CONTROL, free_port
from tests.harness.wait import wait_until

SEPARATE: dict[str, Any] = {"control": {"separate": True}}
MONITORED: dict[str, Any] = {"metrics": {"serviceMonitor": {"enabled": True},
                                         "prometheusRule": {"enabled": True}}}


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    return found


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pod(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]


def test_without_separate_no_control_value_reaches_the_rendering(
    helm: Path, tmp_path: Path
) -> None:
    """With `control.separate` off (the default), the chart renders as it did before the
    option: no `control.*` value changes a byte. (At the option's merge its default
    rendering was compared byte for byte with the chart's before it.)"""
    args = ["template", "rel", str(CHART), "-n", "isthmus-system", "--kube-version", KUBE_VERSION]
    out = run_helm(helm, args, values=merge(SITE_VALUES, MONITORED), tmp=tmp_path).stdout
    assert "component: control" not in out and "--no-control" not in out
    other = {"control": {"separate": False, "replicaCount": 5, "metricsPort": 7000,
                         "resources": {"requests": {"cpu": "2"}}, "affinity": {"x": {}},
                         "livenessProbe": {"tcpSocket": {"port": 1}},
                         "podDisruptionBudget": {"minAvailable": 3},
                         "networkPolicy": {"ingressFrom": [{"podSelector": {}}]}}}
    assert run_helm(helm, args, values=merge(merge(SITE_VALUES, MONITORED), other),
                    tmp=tmp_path).stdout == out


def test_separate_runs_isthmus_control_beside_servers_without_control(render: Render) -> None:
    objs = render(merge(SEPARATE, {
        "control": {"replicaCount": 3, "metricsPort": 9191, "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
        "nodeSelector": {"pool": "infra"}, "tolerations": [{"key": "infra", "operator": "Exists"}],
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "extraVolumes": [{"name": "jwks", "configMap": {"name": "jwks"}}],
        "extraVolumeMounts": [{"name": "jwks", "mountPath": "/etc/jwks"}]}))
    server, control = _named(objs, "Deployment", "rel-isthmus"), _named(
        objs, "Deployment", "rel-isthmus-control")
    (s,), (c,) = _pod(server)["containers"], _pod(control)["containers"]
    assert s["args"] == ["server", "--config", "/etc/isthmus/isthmus.yaml", "--no-control"]
    assert c["args"] == ["control", "--config", "/etc/isthmus/isthmus.yaml",
                         "--api-host", "rel-isthmus.isthmus-system.svc", "--api-port", "8080",
                         "--metrics-host", "0.0.0.0", "--metrics-port", "9191"]
    # both command lines parse with the real CLI (a renamed flag fails here)
    cli = typer.main.get_command(app)
    for args in (s["args"], c["args"]):
        cli.make_context("isthmus", list(args), resilient_parsing=False)
    assert control["spec"]["replicas"] == 3 and server["spec"]["replicas"] == 2
    assert control["spec"]["strategy"] == server["spec"]["strategy"]
    # same image, config, secrets, service account and hardening as the servers
    for key in ("image", "env", "volumeMounts", "securityContext"):
        assert c[key] == s[key], key
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in c["env"]
    for key in ("serviceAccountName", "volumes", "securityContext", "nodeSelector",
                "tolerations"):
        assert _pod(control)[key] == _pod(server)[key], key
    spread = _pod(control)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert spread["labelSelector"]["matchLabels"] == control["spec"]["selector"]["matchLabels"]
    ann = "checksum/config"
    assert (control["spec"]["template"]["metadata"]["annotations"][ann]
            == server["spec"]["template"]["metadata"]["annotations"][ann])
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"memory": "2Gi"}}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    # the API Service, PDB and NetworkPolicy of the servers select no control pod, and back
    labels = control["spec"]["template"]["metadata"]["labels"]
    assert not _selects(_named(objs, "Service", "rel-isthmus")["spec"]["selector"], labels)
    assert not _selects(server["spec"]["selector"]["matchLabels"], labels)
    assert not _selects(control["spec"]["selector"]["matchLabels"],
                        server["spec"]["template"]["metadata"]["labels"])
    assert _selects(control["spec"]["selector"]["matchLabels"], labels)


def test_the_control_pods_get_their_own_pdb_and_network_policy(render: Render) -> None:
    objs = render(merge(SEPARATE, {
        "control": {"podDisruptionBudget": {"minAvailable": "50%"},
                    "networkPolicy": {"ingressFrom": [{"namespaceSelector": {}}]}},
        "networkPolicy": {"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}}))
    labels = _named(objs, "Deployment", "rel-isthmus-control")[
        "spec"]["template"]["metadata"]["labels"]
    pdb = _named(objs, "PodDisruptionBudget", "rel-isthmus-control")["spec"]
    assert pdb["minAvailable"] == "50%" and _selects(pdb["selector"]["matchLabels"], labels)
    server_pdb = _named(objs, "PodDisruptionBudget", "rel-isthmus")["spec"]
    assert not _selects(server_pdb["selector"]["matchLabels"], labels)
    net = _named(objs, "NetworkPolicy", "rel-isthmus-control")["spec"]
    assert _selects(net["podSelector"]["matchLabels"], labels)
    assert net["policyTypes"] == ["Ingress", "Egress"]
    assert net["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}],
                               "from": [{"namespaceSelector": {}}]}]
    assert net["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]
    # one control replica: no PDB (it would block every drain); policies off: none
    assert [p["metadata"]["name"] for p in by_kind(
        render(merge(SEPARATE, {"control": {"replicaCount": 1}})), "PodDisruptionBudget")] == [
        "rel-isthmus"]
    off = render(merge(SEPARATE, {"podDisruptionBudget": {"enabled": False},
                                  "networkPolicy": {"enabled": False}}))
    assert not by_kind(off, "PodDisruptionBudget") and not by_kind(off, "NetworkPolicy")


def test_prometheus_scrapes_the_control_pods_as_a_job_of_their_own(render: Render) -> None:
    objs = render(merge(SEPARATE, MONITORED))
    svc = _named(objs, "Service", "rel-isthmus-control")
    pod = _named(objs, "Deployment", "rel-isthmus-control")["spec"]["template"]
    assert _selects(svc["spec"]["selector"], pod["metadata"]["labels"])
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == pod["spec"]["containers"][0]["ports"][0]["name"] == "metrics"
    sm = _named(objs, "ServiceMonitor", "rel-isthmus-control")["spec"]
    assert _selects(sm["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert sm["endpoints"] == [{"port": port["name"], "path": "/metrics", "interval": "30s"}]
    # the servers' ServiceMonitor keeps its one target: the API Service's `http` port
    server_sm = _named(objs, "ServiceMonitor", "rel-isthmus")["spec"]
    assert [e["port"] for e in server_sm["endpoints"]] == ["http"]
    assert "http" not in {p["name"] for p in svc["spec"]["ports"]}
    # the control group's job label is that Service's name (the Operator's default job)
    groups = one(objs, "PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in groups] == ["isthmus", "isthmus-control"]
    for rule in groups[1]["rules"]:
        assert 'up{job="rel-isthmus-control"}' in rule["expr"], rule
    assert len(one(render(MONITORED), "PrometheusRule")["spec"]["groups"]) == 1


REFUSED: list[Any] = [
    pytest.param({"database": {"existingSecret": "", "url": "sqlite:////data/i.db"},
                  "replicaCount": 1}, "control.separate needs PostgreSQL", id="sqlite"),
    pytest.param({"config": {"control": {"enabled": False}}},
                 "config.control.enabled is false", id="control-disabled"),
    pytest.param({"config": {"server": {"metrics_auth": True}}},
                 "config.server.metrics_auth is on", id="metrics-auth"),
    pytest.param({"control": {"replicas": 2}}, "additional properties 'replicas'", id="typo"),
]


@pytest.mark.parametrize(("values", "says"), REFUSED)
def test_separate_refuses_what_isthmus_control_would_refuse(
    helm: Path, tmp_path: Path, values: dict[str, Any], says: str
) -> None:
    args = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION]
    proc = run_helm(helm, args, values=merge(merge(SITE_VALUES, SEPARATE), values),
                    tmp=tmp_path, check=False)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    if "replicas" not in values.get("control", {}):  # the same values without separate pass
        run_helm(helm, args, values=merge(SITE_VALUES, values), tmp=tmp_path)


def test_the_control_alerts_fire_on_the_control_job(render: Render, tmp_path: Path) -> None:
    objs = render(merge(SEPARATE, MONITORED))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(one(objs, "PrometheusRule")["spec"]))
    check = promtool.run(["check", "rules", str(rules)])
    assert check.returncode == 0, check.stdout + check.stderr
    summary = {r["alert"]: r["annotations"]["summary"]
               for r in one(objs, "PrometheusRule")["spec"]["groups"][1]["rules"]}

    def case(name: str, series: dict[str, str], minute: int, alert: str,
             labels: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": [
                    {"exp_labels": labels, "exp_annotations": {"summary": summary[alert]}}]}]}

    a, b = (f'up{{job="rel-isthmus-control", instance="{i}"}}' for i in "ab")
    tests = [
        case("every control replica down", {a: "0x20", b: "0x20"}, 6, "IsthmusControlDown",
             {"severity": "critical"}),
        case("one control replica of two down", {a: "1x20", b: "0x20"}, 12,
             "IsthmusControlReplicaDown", {"severity": "warning"}),
        # no control target at all (not scraped) is an outage too
        case("no control target", {'up{job="rel-isthmus", instance="a"}': "1x20"}, 6,
             "IsthmusControlDown", {"severity": "critical", "job": "rel-isthmus-control"}),
    ]
    spec = tmp_path / "rules.test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m",
                                    "tests": tests}))
    proc = promtool.run(["test", "rules", str(spec)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    docs = (REPO / "docs" / "operations.md").read_text()
    for rule in one(objs, "PrometheusRule")["spec"]["groups"][1]["rules"]:
        assert f"### `{rule['alert']}`" in docs, f"docs/operations.md: nothing on {rule['alert']}"


@pytest.mark.postgres
def test_the_rendered_control_command_takes_the_lease_and_answers_its_probe(
    render: Render, tmp_path: Path, pg_server: Any, pg_template: str
) -> None:
    """The control container's command as rendered, run for real: its probe's URL answers
    (with the control loop's metrics) and the process takes the lease."""
    port = free_port()
    objs = render(merge(SEPARATE, {"control": {"metricsPort": port}, "config": {
        "backends": [], "pools": [], "control": FAST_CONTROL}}))
    config = tmp_path / "isthmus.yaml"
    config.write_text(one(objs, "ConfigMap")["data"]["isthmus.yaml"])
    (c,) = _pod(_named(objs, "Deployment", "rel-isthmus-control"))["containers"]
    args = [str(config) if a == "/etc/isthmus/isthmus.yaml" else a for a in c["args"]]
    db_url = pg_server.url(pg_server.new_database(pg_template))
    env = {**os.environ, "ISTHMUS_DATABASE_URL": db_url, "ISTHMUS_ADMIN_TOKEN": "t0ken"}
    with open(tmp_path / "control.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "broker.cli.main", *args], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    probe = c["readinessProbe"]["httpGet"]
    try:
        def answers() -> str | None:
            assert proc.poll() is None, (tmp_path / "control.log").read_text()[-3000:]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}{probe['path']}", timeout=5)
            except httpx.TransportError:
                return None
            return r.text if r.status_code == 200 else None

        body = wait_until(answers, 120, "the control pod's probe to answer")
        assert "isthmus_admission_cycle_seconds_count" in body

        def leading() -> bool:
            with psycopg.connect(db_url) as conn:
                rows = conn.execute("SELECT holder, expires_at > now() FROM leader_lease")
                return any(h.split(":")[1] == str(proc.pid) and live for h, live in rows)

        wait_until(leading, 120, "the control process to take the lease")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def test_lint_is_clean_with_separate(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, ["lint", "--strict", str(CHART)],
                   values=merge(merge(SITE_VALUES, SEPARATE), MONITORED), tmp=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
