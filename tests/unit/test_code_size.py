"""Small modules and short functions in broker/, policies/ and backends/ (migrations aside):
no function over 60 lines, no module over 400."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "policies", "backends")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


def oversized(root: Path = ROOT) -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            name = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8")
            if len(text.splitlines()) > MAX_MODULE_LINES:
                found.add(name)
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    if (node.end_lineno or node.lineno) - first + 1 > MAX_FUNCTION_LINES:
                        found.add(f"{name}:{node.name}")
    return found


def test_no_long_function_or_module() -> None:
    assert sorted(oversized()) == []


def test_the_check_sees_a_long_function_and_module(tmp_path: Path) -> None:
    """The measure itself: a module of 401 lines holding a function of 61 is reported twice."""
    package = tmp_path / "broker"
    package.mkdir()
    body = "\n".join(["def long() -> None:", *["    pass"] * 60, *["x = 1"] * 340])
    (package / "big.py").write_text(body + "\n", encoding="utf-8")
    assert sorted(oversized(tmp_path)) == ["broker/big.py", "broker/big.py:long"]
