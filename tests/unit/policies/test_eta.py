"""Queue position and estimated start (policies/eta.py) on small snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.admission import admission_cycle
from policies.eta import estimate
from tests.unit.policies.builders import T0, at, inventory, make_job, make_pool, q, quota_config

QUOTAS = quota_config({"vision": (None, {"h100": q(1000)}), "nlp": (None, {"h100": q(1000)})})


def _run(pool, *jobs, factor: float = 1.0):
    inv = inventory(pool)
    result = admission_cycle(list(jobs), inv, QUOTAS, quota_usage(), T0)
    return result, estimate(result.decisions, {j.id: j for j in jobs}, inv, T0,
                            runtime_factor=factor)


def quota_usage():
    from policies.types import Usage

    return Usage()


def _job(gpus: int, replicas: int = 1, runtime_min: float = 60, team: str = "vision",
         topology: str | None = None):
    j = make_job().gpus(gpus).replicas(replicas).team(team).topology(topology).build()
    return replace(j, max_runtime_s=int(runtime_min * 60))


CASES = [
    # one 8-GPU node, busy until minute 30: a 1-node job starts then
    pytest.param(lambda: make_pool().shape(racks=1, nodes=1).release("n0", (30, 8)),
                 [_job(8)], [at(30)], "releases", id="waits-for-release"),
    # the first waiting job takes the release; the second waits for the first's declared end
    pytest.param(lambda: make_pool().shape(racks=1, nodes=1).release("n0", (30, 8)),
                 [_job(8, runtime_min=60), _job(8)], [at(30), at(90)], "releases",
                 id="queue-behind-declared-runtime"),
    # a small job fits in a gap the big one leaves (backfill), without delaying it
    pytest.param(lambda: make_pool().shape(racks=1, nodes=2)
                 .release("n0", (30, 8)).release("n1", (120, 4)).use("n1", 4),
                 [_job(8, replicas=2), _job(4, runtime_min=20)], [at(120), T0], "releases",
                 id="backfill-never-delays"),
]


@pytest.mark.parametrize(("pool", "jobs", "starts", "method"), CASES)
def test_estimated_starts(pool, jobs, starts, method) -> None:
    result, est = _run(pool(), *jobs)
    for job, start in zip(jobs, starts, strict=True):
        d = result.by_job()[job.id]
        if d.admitted:
            assert start == T0, d
            continue
        e = est[job.id]
        assert e.at == start, (e, d.reason)
        assert e.method.split(" ")[0] in (method, "now")


def test_positions_overall_and_per_team() -> None:
    pool = make_pool().shape(racks=1, nodes=1).use("n0", 8)
    jobs = [_job(8, team="vision"), _job(8, team="nlp"), _job(8, team="vision")]
    result, est = _run(pool, *jobs)
    order = [d.job_id for d in result.decisions]
    positions = [(est[j].position, est[j].team_position) for j in order]
    assert [p for p, _ in positions] == [1, 2, 3]
    by_team: dict[str, list[int]] = {}
    for j in order:
        team = next(x.team for x in jobs if x.id == j)
        by_team.setdefault(team, []).append(est[j].team_position)
    assert by_team == {"vision": [1, 2], "nlp": [1]}


def test_busy_gpus_without_a_known_end_give_no_date() -> None:
    pool = make_pool().shape(racks=1, nodes=1).use("n0", 8)
    job = _job(8)
    _, est = _run(pool, job)
    assert est[job.id].at is None and "without a known end" in est[job.id].method


def test_runtime_factor_scales_declared_times() -> None:
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (60, 8))
    job = _job(8)
    _, est = _run(pool, job, factor=0.5)
    assert est[job.id].at == at(30) and "x0.50" in est[job.id].method


def test_quota_wait_is_not_dated() -> None:
    quotas = quota_config({"vision": (None, {"h100": q(0)})})
    pool = make_pool().shape(racks=1, nodes=1)
    job = _job(8)
    inv = inventory(pool)
    result = admission_cycle([job], inv, quotas, quota_usage(), T0)
    est = estimate(result.decisions, {job.id: job}, inv, T0)
    assert est[job.id].at is None and est[job.id].method.startswith("unknown: waits for")
