"""Every benchmark module imports: a refactor that moves a name the benchmarks use breaks them
silently otherwise (bench/submit_limit.py imported `utcnow` from its old home for a session)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_the_benchmarks_are_found() -> None:
    assert {"submit", "submit_limit", "admission", "reconcile"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
