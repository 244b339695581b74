"""The tiers (tests/harness/tiers.py): the full suite leaves nothing out; an ``-m`` that does
not name ``slow`` or ``ui`` (the README's fast tier) leaves those tests out."""

from __future__ import annotations

import pytest

from tests.harness.tiers import OUT_OF_FAST_TIER, left_out_by

FAST_TIER = "not slurm and not k8s and not postgres"


@pytest.mark.parametrize(("markexpr", "left_out"), [
    ("", set()),
    ("   ", set()),
    (FAST_TIER, {"slow", "ui"}),
    ("not slurm and not k8s", {"slow", "ui"}),
    ("postgres", {"slow", "ui"}),
    ("slow", {"ui"}),
    ("not slow", {"ui"}),
    ("ui", {"slow"}),
    ("slow or ui", set()),
    ("(slow)and not(ui)", set()),
    ("slowest", {"slow", "ui"}),  # names are whole words
])
def test_an_expression_leaves_out_the_tiers_it_does_not_name(markexpr: str,
                                                             left_out: set[str]) -> None:
    assert left_out_by(markexpr) == left_out


def test_the_tier_markers_are_declared(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert set(OUT_OF_FAST_TIER) <= declared


def test_this_session_holds_no_test_of_a_tier_it_leaves_out(request: pytest.FixtureRequest) -> None:
    """Run under the fast tier, this fails if the collection hook of tests/conftest.py is gone
    (pytest's own ``-m`` keeps a test marked ``slow`` that the expression does not exclude)."""
    left_out = left_out_by(str(request.config.getoption("markexpr") or ""))
    kept = [item.nodeid for item in request.session.items
            if {m.name for m in item.iter_markers()} & left_out]
    assert kept == []
