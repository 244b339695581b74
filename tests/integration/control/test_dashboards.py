"""deploy/grafana/*.json: every PromQL expression parses (promtool, after Grafana's variables
are filled in) and names only metrics the broker's /metrics exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures import promtool
from tests.harness.metrics import metrics_workload, scrape_metrics
from tests.harness.sim import Sim

GRAFANA = Path(__file__).resolve().parents[3] / "deploy" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "${job}": "j", "$job": "j",
             "$team": "vision", "$pool": "k8s-a100"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}


def _expressions(node: Any) -> Iterator[str]:
    """Panel targets' `expr` and query variables' `label_values(metric, label)` metric."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "definition" and isinstance(value, str):
                m = re.fullmatch(r"label_values\((.+),\s*\w+\)", value)
                assert m, f"unexpected variable query {value!r}"
                yield m.group(1)
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item)


def _filled(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label matchers,
    grouping clauses, ranges, function calls, numbers and keywords are taken out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b[a-zA-Z_]\w*\s*\(", "(", e)
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", e))
    return {n for n in names if n.lower() not in KEYWORDS and not re.fullmatch(r"\d+\w*", n)}


def _all() -> list[tuple[str, str]]:
    return [(path.name, expr) for path in DASHBOARDS
            for expr in _expressions(json.loads(path.read_text()))]


def test_the_three_dashboards_exist_and_query_something() -> None:
    assert [p.name for p in DASHBOARDS] == ["isthmus-federation.json", "isthmus-job.json",
                                            "isthmus-team.json"]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] and board["title"].startswith("Isthmus")
        assert any(True for _ in _expressions(board)), path.name


def test_the_name_extraction_sees_foreign_metrics() -> None:
    assert metric_names('sum by (team) (rate(isthmus_x_total{kind="a"}[5m])) / up') == {
        "isthmus_x_total", "up"}
    assert metric_names("histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m])))") == {
        "a_bucket"}


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:check:{i}", "expr": _filled(expr)}
        for i, (_, expr) in enumerate(_all())]}]}
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool.run(["check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_dashboard_metric_is_exported_by_the_broker(sim: Sim) -> None:
    metrics_workload(sim)
    text = scrape_metrics(sim)
    samples = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    families = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    for board, expr in _all():
        names = metric_names(expr)
        assert names, f"{board}: {expr!r} selects no metric"
        for name in names:
            family = re.sub(r"_(bucket|count|sum|total)$", "", name)
            assert name in samples or name in families or family in families, (
                f"{board}: {name} (in {expr!r}) is not exported by the broker")
