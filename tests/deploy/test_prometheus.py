"""The alert rules: promtool checks them and runs their unit tests, the Helm chart's copy is
generated from them, and every alert has a unit test and a runbook section."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.fixtures import promtool
from tests.harness.helm import REPO

PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "alerts.yaml"


def _alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["alert"] for g in groups for r in g["rules"]]


def test_the_rules_pass_promtool_check_rules() -> None:
    proc = promtool.run(["check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    proc = promtool.run(["test", "rules", str(PROM / "alerts.test.yaml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((PROM / "alerts.test.yaml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"]
             if case.get("exp_alerts")}
    assert set(_alerts()) <= fired, f"no firing test for {sorted(set(_alerts()) - fired)}"


def test_the_helm_chart_rules_are_generated_from_alerts_yaml() -> None:
    proc = subprocess.run([sys.executable, str(PROM / "sync-chart-rules"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_alert_has_a_runbook_section() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    for alert in _alerts():
        assert f"### `{alert}`" in docs, f"docs/operations.md: no runbook section for {alert}"
