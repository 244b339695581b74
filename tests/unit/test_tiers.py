"""The tiers (tests/harness/tiers.py): the full suite leaves nothing out; an ``-m`` that does
not name ``slow`` or ``ui`` (the README's fast tier) leaves those tests out. The local clusters'
tests share one xdist group (scripts/test runs two workers): a cluster test in the other worker
would race its fixture (which cancels every queued Slurm job) and the outage tests (which stop
slurmctld or the apiserver) against the group's tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.harness.tiers import CLUSTER_GROUP, OUT_OF_FAST_TIER, left_out_by, on_local_cluster

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



@dataclass
class _Item:
    markers: tuple[str, ...] = ()
    fixturenames: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[pytest.Mark]:
        return [getattr(pytest.mark, name).mark for name in self.markers]


@pytest.mark.parametrize(("item", "expected"), [
    (_Item(("slurm",)), True),
    (_Item(("k8s", "slow")), True),
    (_Item(fixturenames=["tmp_path", "slurm_cluster"]), True),
    (_Item(fixturenames=["k8s_namespace", "k8s_cluster"]), True),
    (_Item(fixturenames=["k8s_kueue_cluster"]), True),
    (_Item(("postgres", "slow"), ["db", "tmp_path"]), False),
    (_Item(("ui",)), False),
])
def test_a_test_is_on_a_local_cluster_by_its_marker_or_its_fixtures(
        item: _Item, expected: bool) -> None:
    assert on_local_cluster(item) is expected  # type: ignore[arg-type]


def test_every_collected_cluster_test_is_in_the_cluster_group(request: pytest.FixtureRequest,
                                                              ) -> None:
    """Over the whole session's collection (the full suite when run by scripts/test)."""
    items = request.session.items
    assert request.node in items
    # in an xdist worker of --dist loadgroup, xdist has read the group into the node id by now:
    # proof that the marker came before xdist's own collection hook, not after it
    grouped_by_xdist = bool(getattr(request.config, "workerinput", None)) and bool(
        request.config.getvalue("loadgroup"))
    for item in items:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert (groups == [CLUSTER_GROUP]) is on_local_cluster(item), item.nodeid
        if grouped_by_xdist:
            assert item.nodeid.endswith(f"@{CLUSTER_GROUP}") is on_local_cluster(item), item.nodeid
