"""The local clusters' tests share one xdist group (scripts/test runs two workers): a cluster
test in the other worker would race its fixture (which cancels every queued Slurm job) and the
outage tests (which stop slurmctld or the apiserver) against the group's tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.harness.tiers import CLUSTER_GROUP, on_local_cluster


@dataclass
class _Item:
    markers: tuple[str, ...] = ()
    fixturenames: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[pytest.Mark]:
        return [pytest.Mark(name, (), {}) for name in self.markers]


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
    for item in items:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert (groups == [CLUSTER_GROUP]) is on_local_cluster(item), item.nodeid
