"""The alert rules (alerts.yaml, and control-alerts.yaml for a control loop run in processes of
its own): promtool checks them and runs their unit tests, the Helm chart's copies are
generated from them, and every alert has a unit test and a runbook section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixtures import promtool
from tests.harness.helm import REPO

PROM = REPO / "deploy" / "prometheus"
RULES = [PROM / "alerts.yaml", PROM / "control-alerts.yaml"]


def _alerts(*files: Path) -> list[str]:
    groups = [g for f in files or RULES for g in yaml.safe_load(f.read_text())["groups"]]
    return [r["alert"] for g in groups for r in g["rules"]]


@pytest.mark.parametrize("rules", RULES, ids=[f.name for f in RULES])
def test_the_rules_pass_promtool_check_rules(rules: Path) -> None:
    proc = promtool.run(["check", "rules", str(rules)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts(rules))} rules found" in proc.stdout


def test_the_unit_tests_load_every_rule_file() -> None:
    spec = yaml.safe_load((PROM / "alerts.test.yaml").read_text())
    assert spec["rule_files"] == [f.name for f in RULES]


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
