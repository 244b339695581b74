"""The whole admission path on the simulator: a small trace, three strategies, same seed twice."""

from __future__ import annotations

import pytest

from bench import placement_quality as pq
from policies.types import FlavorQuota, QuotaConfig, TeamQuota

QUOTAS = QuotaConfig(
    teams={
        t: TeamQuota(t, "all", {f: FlavorQuota(pq.capacity_gpus()) for f in pq.FLAVORS})
        for t in pq.TEAMS
    },
    flavor_cost={"h100": 2.0, "a100": 1.0},
)


def _run(seed: int) -> pq.Metrics:
    trace = pq.make_trace(150, seed, 1.2)
    pq._RACKS.clear()
    return pq.simulate("isthmus", trace, pq.isthmus_strategy(QUOTAS), QUOTAS, seed=seed)


def test_every_job_runs_and_topology_is_kept() -> None:
    m = _run(5)
    assert len(m.waits) == 150
    assert m.spread == 0  # rack-bound gangs were never spread by Isthmus
    assert all(w >= 0 for w in m.waits.values())


@pytest.mark.slow
def test_same_seed_same_outcome() -> None:
    assert _run(5).waits == _run(5).waits
    assert _run(5).waits != _run(6).waits


@pytest.mark.slow
def test_firstfit_baseline_spreads_gangs_and_static_pins_teams() -> None:
    trace = pq.make_trace(150, 5, 1.2)
    pq._RACKS.clear()
    ff = pq.simulate("firstfit", trace, pq.firstfit, QUOTAS, seed=5)
    assert len(ff.waits) == 150
    pin = {t: "slurm" for t in pq.TEAMS}
    pq._RACKS.clear()
    st = pq.simulate("static", trace, pq.isthmus_strategy(QUOTAS), QUOTAS, pin, seed=5)
    assert len(st.waits) == 150
