"""Admission cycle: order, fair share, quota reservation, backfill, starvation, preemption."""

from __future__ import annotations

from broker.domain import Reason
from broker.domain.inventory import InventorySnapshot
from policies.cycle import AdmissionParams, CycleResult, admission_cycle
from policies.ordering import OrderingParams, admission_order
from policies.preemption import Preemptor
from policies.types import PendingJob, QuotaConfig, RunningJob, Usage
from tests.unit.policies.builders import (
    at,
    inventory,
    make_job,
    make_pool,
    q,
    quota_config,
    running,
    usage,
)

QUOTAS = quota_config(
    {
        "vision": ("research", {"h100": q(64), "a100": q(64)}),
        "language": ("research", {"h100": q(64), "a100": q(64)}),
    }
)


def cycle(
    jobs: list[PendingJob],
    inv: InventorySnapshot,
    quotas: QuotaConfig = QUOTAS,
    use: Usage | None = None,
    now_min: float = 0,
    params: AdmissionParams | None = None,
    running_jobs: list[RunningJob] | None = None,
) -> CycleResult:
    now = at(now_min)
    pre = Preemptor(running_jobs, quotas, now) if running_jobs is not None else None
    return admission_cycle(jobs, inv, quotas, use or usage(), now, params, pre)


def test_priority_first_and_the_loser_says_why() -> None:
    low = make_job().gpus(8).priority(0).submitted(-10).build()
    high = make_job().gpus(8).priority(1000).submitted(-1).build()
    res = cycle([low, high], inventory(make_pool("p1").shape(1, 1, 1)))
    d = res.by_job()
    assert d[high.id].admitted and not d[low.id].admitted
    assert d[low.id].reason is Reason.HigherPriorityAhead
    assert d[high.id].position == 0


def test_fair_share_puts_the_less_served_team_first() -> None:
    a = make_job().team("vision").gpus(8).submitted(-10).build()
    b = make_job().team("language").gpus(8).submitted(-1).build()
    res = cycle([a, b], inventory(make_pool("p1").shape(1, 1, 1)), use=usage(vision__h100=32))
    d = res.by_job()
    assert d[b.id].admitted
    assert d[a.id].reason is Reason.FairShareBehind


def test_fair_share_is_charged_within_a_cycle() -> None:
    jobs = [
        make_job().team(t).gpus(8).submitted(i).build()
        for t in ("vision", "language")
        for i in range(4)
    ]
    res = cycle(jobs, inventory(make_pool("p1").shape(1, 1, 4)))
    teams = [j.team for j in jobs if res.by_job()[j.id].admitted]
    assert sorted(teams) == ["language", "language", "vision", "vision"]


def test_order_ties_break_on_submission_time() -> None:
    jobs = [make_job().team("vision").submitted(m).build() for m in (5, 1, 3)]
    assert [j.submitted_at for j in admission_order(jobs, QUOTAS, Usage())] == [at(1), at(3), at(5)]


def test_no_one_job_per_queue_limit() -> None:
    jobs = [make_job().gpus(8).submitted(i).build() for i in range(4)]
    res = cycle(jobs, inventory(make_pool("p1").shape(1, 1, 4)))
    assert res.record.admitted == 4


def test_quota_is_reserved_as_jobs_are_admitted() -> None:
    quotas = quota_config({"vision": (None, {"h100": q(16)})})
    jobs = [make_job().gpus(8).submitted(i).build() for i in range(3)]
    res = cycle(jobs, inventory(make_pool("p1")), quotas=quotas)
    assert [d.reason for d in res.decisions] == [
        Reason.Admitted,
        Reason.Admitted,
        Reason.QuotaExhausted,
    ]
    assert "uses 16 of 16" in res.decisions[2].message


def test_borrowed_gpus_are_reported() -> None:
    quotas = quota_config({"vision": ("c", {"h100": q(8)}), "language": ("c", {"h100": q(8)})})
    res = cycle([make_job().gpus(8).replicas(2).build()], inventory(make_pool("p1")), quotas)
    assert res.decisions[0].admitted and res.decisions[0].borrowed_gpus == 8


def test_retry_backoff_waits_in_heads_phase() -> None:
    job = make_job().not_before(5).build()
    res = cycle([job], inventory(make_pool("p1")))
    assert res.decisions[0].reason is Reason.BackoffAfterFailure
    assert job.not_before is not None
    assert job.not_before.strftime("until %Y-%m-%dT%H:%M:%SZ") in res.decisions[0].message
    later = cycle([job], inventory(make_pool("p1")), now_min=2)
    assert later.decisions[0].message == res.decisions[0].message  # no event every cycle


def test_backfill_small_jobs_around_a_large_gang() -> None:
    big = make_job().gpus(8).replicas(4).topology("rack").submitted(-5).build()
    small = make_job().gpus(8).submitted(-1).build()
    inv = inventory(make_pool("p1").use("n0", 8).use("n4", 8))
    d = cycle([big, small], inv).by_job()
    assert not d[big.id].admitted and d[big.id].reservation is None
    assert d[small.id].admitted


def test_starving_gang_holds_a_rack_so_backfill_cannot_take_it() -> None:
    big = make_job().gpus(8).replicas(4).topology("rack").submitted(-120).build()
    smalls = [make_job().gpus(8).submitted(-1 - i / 10).build() for i in range(8)]
    inv = inventory(make_pool("p1").use("n0", 8).use("n4", 8))
    params = AdmissionParams(ordering=OrderingParams(starvation_after_s=3600))
    res = cycle([big, *smalls], inv, params=params)
    d = res.by_job()
    reservation = d[big.id].reservation
    assert reservation is not None and "p1:b0/r0" in reservation
    admitted = [d[s.id] for s in smalls if d[s.id].admitted]
    assert len(admitted) == 3  # the other rack only
    held_rack = reservation.split(":")[1].split(" ")[0]
    domains = [a.placement.topology_domain if a.placement else None for a in admitted]
    assert all(dom is not None and not dom.startswith(held_rack) for dom in domains)
    assert res.record.reservations == (f"{big.id}@{d[big.id].reservation}",)


def test_priority_preemption_picks_lower_priority_victims() -> None:
    urgent = make_job().gpus(8).replicas(2).priority(1000, preempting=True).build()
    inv = inventory(make_pool("p1").shape(1, 1, 2).use_all_but({}))
    run = [
        running("r-low", priority=0),
        running("r-mid", priority=100),
        running("r-high", priority=1000),
    ]
    d = cycle([urgent], inv, running_jobs=run).decisions[0]
    assert d.reason is Reason.WaitingForPreemption
    assert [v.job_id for v in d.victims] == ["r-low", "r-mid"]


def test_non_preempting_class_just_waits() -> None:
    job = make_job().gpus(8).priority(1000).build()
    inv = inventory(make_pool("p1").shape(1, 1, 1).use_all_but({}))
    d = cycle([job], inv, running_jobs=[running("r", priority=0)]).decisions[0]
    assert d.reason is Reason.InsufficientCapacity and not d.victims


def test_quota_reclaim_preempts_borrowers() -> None:
    quotas = quota_config({"vision": ("c", {"h100": q(16)}), "language": ("c", {"h100": q(16)})})
    use = usage(language__h100=32)
    run = [
        running("borrower", team="language", gpus=16, borrowed=True),
        running("owner", team="language", gpus=16),
    ]
    job = make_job().team("vision").gpus(8).build()
    d = cycle([job], inventory(make_pool("p1")), quotas, use, running_jobs=run).decisions[0]
    assert d.reason is Reason.WaitingForPreemption
    assert [v.job_id for v in d.victims] == ["borrower"]
    assert "reclaims h100 quota lent to team language" in d.victims[0].message


def test_full_team_quota_preempts_the_teams_own_lower_priority_work() -> None:
    # no cohort: vision cannot borrow, and its 16 h100 GPUs run its own low-priority jobs
    quotas = quota_config({"vision": (None, {"h100": q(16)}), "language": (None, {"h100": q(16)})})
    use = usage(vision__h100=16, language__h100=8)
    run = [
        running("v-low", priority=0),
        running("v-mid", priority=100),
        running("l-low", team="language", priority=0),
    ]
    urgent = make_job().team("vision").gpus(8).priority(1000, preempting=True).build()
    d = cycle([urgent], inventory(make_pool("p1")), quotas, use, running_jobs=run).decisions[0]
    assert d.reason is Reason.WaitingForPreemption, d.message
    assert [v.job_id for v in d.victims] == ["v-low"]
    assert "team vision's h100 quota is full" in d.victims[0].message

    # a class that may not preempt waits on the quota; so does a job larger than the quota
    calm = make_job().team("vision").gpus(8).priority(1000).build()
    d = cycle([calm], inventory(make_pool("p1")), quotas, use, running_jobs=run).decisions[0]
    assert d.reason is Reason.QuotaExhausted and not d.victims
    huge = make_job().team("vision").gpus(8).replicas(3).priority(1000, preempting=True).build()
    d = cycle([huge], inventory(make_pool("p1")), quotas, use, running_jobs=run).decisions[0]
    assert d.reason is Reason.QuotaExhausted and not d.victims


def test_same_inputs_same_decisions_and_digest() -> None:
    jobs = [
        make_job()
        .id(f"j{i}")
        .team(("vision", "language")[i % 2])
        .gpus(1 + i % 8)
        .replicas(1 + i % 3)
        .submitted(-i)
        .build()
        for i in range(60)
    ]
    inv = inventory(make_pool("a").use("n1", 3), make_pool("b").flavor_("a100").shape(2, 2, 2))
    jobs_a100 = [j for j in jobs]
    r1 = cycle(jobs_a100, inv)
    r2 = cycle(list(reversed(jobs_a100)), inv)
    assert r1 == r2
    assert r1.record.inputs_digest == r2.record.inputs_digest


def test_capacity_owed_to_jobs_queued_in_the_backend_is_held() -> None:
    pool = (
        make_pool("p1")
        .shape(1, 1, 2)
        .use("p1-n0", 8)
        .use("p1-n1", 4)
        .pending(isthmus_jobs=1)
        .set(max_isthmus_pending=1)
    )
    pool.queue = pool.queue.model_copy(update={"isthmus_pending_gpus": 4})
    d = cycle([make_job().gpus(4).build()], inventory(pool)).decisions[0]
    assert not d.admitted and d.reason is Reason.InsufficientCapacity
    assert "needs 4 GPUs; 0 of 16 free" in d.message


def _low(id: str, *nodes: str, ckpt: float, gpus: int = 8) -> RunningJob:
    return running(id, priority=0, gpus=gpus, checkpoint=ckpt, nodes=nodes)


def test_rack_gang_preempts_exactly_enough_in_one_rack() -> None:
    gang = make_job().gpus(8).replicas(2).topology("rack").priority(1000, True).build()
    run = [
        _low("a", "n0", ckpt=-10),
        _low("c", "n4", ckpt=-20),
        _low("b", "n1", ckpt=-30),
        _low("d", "n5", ckpt=-40),
        *(running(f"h{n}", priority=1000, nodes=(f"n{n}",)) for n in (2, 3, 6, 7)),
    ]
    inv = inventory(make_pool("p1").run(*run))
    d = cycle([gang], inv, running_jobs=run).decisions[0]
    assert d.reason is Reason.WaitingForPreemption, d.message
    assert [v.job_id for v in d.victims] == ["a", "b"]
    assert "in b0/r00" in d.message


def test_fragmented_free_gpus_preempt_one_half_node_job() -> None:
    # 8 GPUs free as 4 + 4 on two nodes: enough by count, but no node holds the 1 x 8 job
    job = make_job().gpus(8).priority(1000, True).build()
    run = [
        _low("x", "n0", gpus=4, ckpt=-10),
        _low("y", "n1", gpus=4, ckpt=-20),
        _low("z", "n2", ckpt=-30),
        _low("w", "n3", ckpt=-60),
    ]
    inv = inventory(make_pool("p1").shape(1, 1, 4).run(*run))
    d = cycle([job], inv, running_jobs=run).decisions[0]
    assert d.reason is Reason.WaitingForPreemption, d.message
    assert [v.job_id for v in d.victims] == ["x"]


def test_preemption_that_would_not_help_keeps_the_reason_and_says_so() -> None:
    gang = make_job().gpus(8).replicas(2).topology("rack").priority(1000, True).build()
    run = [
        _low("a", "n0", ckpt=-10),
        _low("b", "n4", ckpt=-10),
        *(running(f"h{n}", priority=1000, nodes=(f"n{n}",)) for n in (1, 2, 3, 5, 6, 7)),
    ]
    inv = inventory(make_pool("p1").run(*run))
    d = cycle([gang], inv, running_jobs=run).decisions[0]
    assert d.reason is Reason.InsufficientCapacity and not d.victims
    assert "p1: preemption would not help" in d.message

    # fragmented and nothing to stop where it would help: TopologyUnsatisfiable stays
    frag = inventory(make_pool("p1").shape(1, 1, 2).use("n0", 4).use("n1", 4))
    high = [running("h", priority=1000, gpus=4, nodes=("n0",))]
    res = cycle([make_job().gpus(8).priority(1000, True).build()], frag, running_jobs=high)
    assert res.decisions[0].reason is Reason.TopologyUnsatisfiable
    assert "preemption would not help" in res.decisions[0].message


def test_victims_taken_by_one_job_are_not_counted_again_by_the_next() -> None:
    first = make_job().id("first").gpus(8).priority(1000, True).build()
    second = make_job().id("second").gpus(8).priority(900, True).submitted(1).build()
    run = [_low("a", "n0", ckpt=-10), running("h", priority=1000, nodes=("n1",))]
    inv = inventory(make_pool("p1").shape(1, 1, 2).run(*run))
    d = cycle([first, second], inv, running_jobs=run).by_job()
    assert [v.job_id for v in d["first"].victims] == ["a"]
    assert not d["second"].victims and "preemption would not help" in d["second"].message


def test_topology_aware_preemption_is_deterministic() -> None:
    gang = make_job().id("g").gpus(8).replicas(2).topology("rack").priority(1000, True).build()
    run = [_low(f"v{n}", f"n{n}", ckpt=-10) for n in range(8)]  # ties on cost everywhere
    inv = inventory(make_pool("p1").run(*run))
    first = cycle([gang], inv, running_jobs=run)
    assert [v.job_id for v in first.decisions[0].victims] == ["v0", "v1"]
    for again in (run[::-1], run[3:] + run[:3]):
        assert cycle([gang], inv, running_jobs=again) == first
