"""Backfill into capacity held for a starving gang (policies/backfill.py): a later job may use
the held GPUs only where, by its declared time limit, it does not delay the gang's expected
start."""

from __future__ import annotations

from dataclasses import replace

from policies.cycle import AdmissionParams, admission_cycle
from policies.ordering import OrderingParams
from policies.types import PendingJob
from tests.unit.policies.builders import (
    T0,
    PoolBuilder,
    inventory,
    make_job,
    make_pool,
    q,
    quota_config,
    usage,
)

QUOTAS = quota_config({"vision": (None, {"h100": q(512)})})
PARAMS = AdmissionParams(ordering=OrderingParams(starvation_after_s=3600))


def held_rack(last_back: float = 600) -> PoolBuilder:
    """Every node busy but n0 (8 GPUs free). Rack r00 (n0-n3): n1 and n2 back at 60 min, n3
    at `last_back`; rack r01 (n4-n7) back at 900 min. A 3 x 8 gang holds n0 and fits in r00
    at 60 min (n0 + n1 + n2)."""
    pool = make_pool("p1").use_all_but({"p1-n0": 8})
    pool.release("n1", (60, 8)).release("n2", (60, 8)).release("n3", (last_back, 8))
    for n in ("n4", "n5", "n6", "n7"):
        pool.release(n, (900, 8))
    return pool


def starving_gang() -> PendingJob:
    return make_job().id("gang").gpus(8).replicas(3).topology("rack").submitted(-120).build()


def small(limit_min: float, gpus: int = 8) -> PendingJob:
    job = make_job().id(f"small-{limit_min:g}").gpus(gpus).submitted(-1).build()
    return replace(job, max_runtime_s=int(limit_min * 60))


def decide(pool: PoolBuilder, *jobs: PendingJob, params: AdmissionParams = PARAMS) -> dict:
    res = admission_cycle(list(jobs), inventory(pool), QUOTAS, usage(), T0, params)
    return res.by_job()


def test_a_job_that_ends_before_the_gang_fits_runs_on_its_held_gpus() -> None:
    got = decide(held_rack(), starving_gang(), small(30))
    assert got["gang"].reservation == "p1:b0/r00 (8 GPUs)"
    d = got["small-30"]
    assert d.admitted and d.placement is not None
    assert d.placement.nodes == ("p1-n0",)
    assert "backfilled" in d.message and "gang" in d.message


def test_a_job_that_would_outlast_the_gangs_start_waits() -> None:
    got = decide(held_rack(), starving_gang(), small(120))
    assert not got["small-120"].admitted
    assert got["gang"].reservation is not None


def test_a_longer_job_may_use_held_gpus_the_gang_does_not_need_by_its_start() -> None:
    # n3 is back at 60 min too: the gang fits on n1-n3 then, so n0 may run past its start
    got = decide(held_rack(last_back=60), starving_gang(), small(120))
    assert got["small-120"].admitted
    assert got["small-120"].placement is not None
    assert got["small-120"].placement.nodes == ("p1-n0",)


def test_gpus_lent_earlier_in_the_cycle_count_against_the_next_job() -> None:
    # n0 and n1 free and held, n2 and n3 back at 60 min: at its start the gang can spare
    # one node for a job running past it, not two
    pool = make_pool("p1").use_all_but({"p1-n0": 8, "p1-n1": 8})
    pool.release("n2", (60, 8)).release("n3", (60, 8))
    for n in ("n4", "n5", "n6", "n7"):
        pool.release(n, (900, 8))
    first = small(120)
    second = replace(small(121), submitted_at=T0.replace(second=1))
    got = decide(pool, starving_gang(), first, second)
    assert got["gang"].reservation == "p1:b0/r00 (16 GPUs)"
    assert got[first.id].admitted
    assert not got[second.id].admitted
    alone = decide(pool, starving_gang(), second)
    assert alone[second.id].admitted


def test_without_release_data_held_gpus_are_not_lent() -> None:
    pool = held_rack()
    pool.releases = {}
    got = decide(pool, starving_gang(), small(30))
    assert got["gang"].reservation is not None
    assert not got["small-30"].admitted


def test_backfill_off_keeps_held_gpus_idle() -> None:
    params = AdmissionParams(ordering=OrderingParams(starvation_after_s=3600, backfill=False))
    got = decide(held_rack(), starving_gang(), small(30), params=params)
    assert got["gang"].reservation is not None
    assert not got["small-30"].admitted


def test_a_safety_factor_counts_the_backfilled_jobs_limit_several_times() -> None:
    # 30 min x 3 = 90 min: past the gang's start at 60 min, and r00 has nothing to spare
    params = AdmissionParams(
        ordering=OrderingParams(starvation_after_s=3600, backfill_factor=3.0,
                                backfill_margin_s=0)
    )
    got = decide(held_rack(), starving_gang(), small(30), params=params)
    assert not got["small-30"].admitted
    got = decide(held_rack(), starving_gang(), small(19), params=params)
    assert got["small-19"].admitted


def test_the_backends_slack_past_a_limit_counts_against_the_gangs_start() -> None:
    # 55 min ends before the gang's start at 60 min, but a backend may run it ~7 min longer
    # (Slurm: rounding and KillWait; Kubernetes: the start-up timeout) and it starts after
    # dispatch: with the default margin it waits, without one it would be backfilled
    assert OrderingParams().backfill_margin_s >= 300 + 59
    got = decide(held_rack(), starving_gang(), small(55))
    assert not got["small-55"].admitted
    assert got["gang"].reservation is not None
    params = AdmissionParams(ordering=OrderingParams(starvation_after_s=3600,
                                                     backfill_margin_s=0))
    assert decide(held_rack(), starving_gang(), small(55), params=params)["small-55"].admitted
    assert decide(held_rack(), starving_gang(), small(52))["small-52"].admitted


def overlapping_holds() -> PoolBuilder:
    """Every GPU busy but 4 on n0. Rack r00: n0's other 4 back at 90 min, n1 at 30, n2 and n3
    at 60; rack r01 at 900 min. A 1 x 8 gang holds n1 (back soonest) and claims it; a 3 x 8
    rack gang then holds n0's 4 GPUs and fits in r00 at 90 min (n0, n2, n3), n1's release
    being the first gang's."""
    pool = make_pool("p1").use_all_but({"p1-n0": 4})
    pool.release("n0", (90, 4)).release("n1", (30, 8))
    pool.release("n2", (60, 8)).release("n3", (60, 8))
    for n in ("n4", "n5", "n6", "n7"):
        pool.release(n, (900, 8))
    return pool


def test_a_later_hold_does_not_count_releases_an_earlier_hold_claimed() -> None:
    one = make_job().id("one").gpus(8).submitted(-180).build()
    rack = make_job().id("rack").gpus(8).replicas(3).topology("rack").submitted(-120).build()
    # 100 min on n0 delays the rack gang past 90 min; only with n1's release at 30 min
    # (the 1 x 8 gang's) would it fit by 60 min and have n0 to spare
    got = decide(overlapping_holds(), one, rack, small(100, gpus=4))
    assert got["one"].reservation == "p1:b0/r00/p1-n1 (0 GPUs)"
    assert got["rack"].reservation == "p1:b0/r00 (4 GPUs)"
    assert not got["small-100"].admitted
    got = decide(overlapping_holds(), one, rack, small(60, gpus=4))  # ends by 67 min
    assert got["small-60"].admitted
    assert got["small-60"].placement is not None
    assert got["small-60"].placement.nodes == ("p1-n0",)
