"""The test suite's own rules: test modules share helpers only through ``tests.harness`` (and
``tests.fixtures``, ``tests.builders``), never by importing one another or a conftest, and
there is one way to wait for a condition."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from tests.harness.paths import ROOT

TESTS = ROOT / "tests"


def _modules() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return dotted.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imported(p) if _is_test_module(n))
        for p in _modules()
    }
    assert {p: n for p, n in offenders.items() if n} == {}


def test_the_rule_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("from tests.integration.control.test_loop_sim import cycle\n"
                      "from tests.deploy import conftest\nfrom tests.harness.sim import state\n")
    assert sorted(n for n in _imported(sample) if _is_test_module(n)) == [
        "tests.deploy.conftest", "tests.integration.control.test_loop_sim"]


def test_one_wait_until_in_the_whole_suite() -> None:
    defined = [
        str(p.relative_to(ROOT)) for p in _modules()
        for node in ast.walk(_tree(p))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name in ("wait_until", "_wait_until", "_wait", "wait_for", "_wait_for")
    ]
    assert defined == ["tests/harness/wait.py"]
