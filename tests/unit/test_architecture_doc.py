"""docs/architecture.md names modules and functions; each of them exists."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.harness.paths import ROOT

DOC = (ROOT / "docs" / "architecture.md").read_text()
NAMES = sorted(set(re.findall(r"`((?:broker|backends|policies|tests)(?:\.\w+)+)`", DOC)))


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_page_names_the_path_of_a_job() -> None:
    assert len(NAMES) > 40
    for step in ("run_admission", "run_dispatch", "reconcile.run_reconcile", "set_state", "derive"):
        assert any(step in n for n in NAMES), step


@pytest.mark.parametrize("dotted", NAMES)
def test_every_named_module_and_function_exists(dotted: str) -> None:
    _resolve(dotted)
