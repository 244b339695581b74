"""Queue position and estimated start (policies/eta.py) on small snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.cycle import admission_cycle
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


def test_runtime_factor_scales_declared_run_times_not_announced_releases() -> None:
    """The factor scales what the waiting jobs declare: the second job waits for the first's
    hour at half (30 minutes). The release at minute 60 is the backend's, of work whose start
    is not known: it stays where announced (scaling the time left to it would move it on at
    every cycle, the receding estimate)."""
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (60, 8))
    first, second = _job(8), _job(8)
    _, est = _run(pool, first, second, factor=0.5)
    assert est[first.id].at == at(60) and "x0.50" in est[first.id].method
    assert est[second.id].at == at(90), est[second.id]


def test_quota_wait_is_not_dated() -> None:
    quotas = quota_config({"vision": (None, {"h100": q(0)})})
    pool = make_pool().shape(racks=1, nodes=1)
    job = _job(8)
    inv = inventory(pool)
    result = admission_cycle([job], inv, quotas, quota_usage(), T0)
    est = estimate(result.decisions, {job.id: job}, inv, T0)
    assert est[job.id].at is None and est[job.id].method.startswith("unknown: waits for")


def test_the_estimate_names_the_nodes_of_its_start() -> None:
    """n1 comes back first (minute 30), n0 at minute 90: a 1-node job's estimate names n1, one
    entry per replica; a job with no date names none."""
    pool = (make_pool().shape(racks=1, nodes=2)
            .release("n0", (90, 8)).release("n1", (30, 8)))
    job = _job(8)
    _, est = _run(pool, job)
    e = est[job.id]
    assert e.at == at(30) and e.pool is not None
    assert [n.rsplit("-", 1)[-1] for n in e.nodes] == ["n1"], e.nodes
    two = _job(4, replicas=2)
    _, est = _run(make_pool().shape(racks=1, nodes=2)
                  .release("n0", (90, 8)).release("n1", (30, 8)), two)
    assert len(est[two.id].nodes) == 2 and len(set(est[two.id].nodes)) == 1  # both on n1
    blind = _job(8)
    _, est = _run(make_pool().shape(racks=1, nodes=1).use("n0", 8), blind)
    assert est[blind.id].nodes == ()


def test_gpus_owed_to_the_backend_queue_are_not_free_for_waiting_jobs() -> None:
    """4 of the node's 8 GPUs are free, but the backend already has 4 Isthmus GPUs pending:
    admission holds the free 4 for them, so a waiting 4-GPU job starts at the release at minute
    30, not now (the replay used to say "now" for such jobs, which then waited)."""
    from policies.types import Usage

    snap = make_pool().shape(racks=1, nodes=1).release("n0", (30, 4)).build()
    owed = snap.model_copy(update={"queue": snap.queue.model_copy(
        update={"isthmus_pending_gpus": 4, "isthmus_pending_jobs": 1})})
    job = _job(4)
    for pool, start in ((snap, T0), (owed, at(30))):
        inv = inventory(pool)
        result = admission_cycle([job], inv, QUOTAS, Usage(), T0)
        est = estimate(result.decisions, {job.id: job}, inv, T0)
        if start == T0:
            assert result.by_job()[job.id].admitted
            continue
        assert not result.by_job()[job.id].admitted
        assert est[job.id].at == start and est[job.id].method == "releases", est[job.id]


def test_a_job_admitted_to_a_backend_queue_takes_the_next_release_first() -> None:
    """Admitted this cycle into the backend's queue (no nodes), a job holds the first release;
    the waiting job behind it gets the one after."""
    from broker.domain.attempts import Placement
    from broker.domain.spec import BackendKind
    from policies.cycle import Decision

    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 8))
    queued, waiting = _job(8, runtime_min=60), _job(8)
    inv = inventory(pool)
    name = inv.pools[0].name
    placed = Placement(backend=BackendKind.SLURM, backend_instance="slurm-a", pool=name,
                       flavor="h100")
    result = admission_cycle([waiting], inv, QUOTAS, quota_usage(), T0)
    decisions = [Decision(queued.id, True, result.decisions[0].reason, "queued", placed),
                 *result.decisions]
    est = estimate(decisions, {queued.id: queued, waiting.id: waiting}, inv, T0)
    assert est[waiting.id].at == at(90), est[waiting.id]


def test_a_reservation_holds_the_free_gpus_of_its_gang_until_it_starts() -> None:
    """Admission holds the free GPUs of a starving gang's domain: 4 of n0's GPUs are free, 4
    come back at minute 60. The 8-GPU gang with a reservation starts at 60; a 4-GPU job of 90
    minutes behind it would end after that, so it may not use the held 4 (backfill,
    policies/backfill.py) and starts after the gang's declared hour, at 120; a 30-minute job
    ends before 60 and starts now in the held GPUs."""
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (60, 4))
    big = _job(8, runtime_min=60)
    inv = inventory(pool)
    from broker.domain.reasons import Reason

    for small, start in ((_job(4, runtime_min=90), at(120)), (_job(4, runtime_min=30), T0)):
        result = admission_cycle([big, small], inv, QUOTAS, quota_usage(), T0)
        by = result.by_job()
        jobs = {big.id: big, small.id: small}
        waiting = replace(by[small.id], admitted=False, placement=None,
                          reason=Reason.InsufficientCapacity)
        free = [by[big.id], waiting]
        held = [replace(by[big.id], reservation=f"{inv.pools[0].name}:* (4 GPUs)"), waiting]
        assert estimate(free, jobs, inv, T0)[small.id].at == T0
        est = estimate(held, jobs, inv, T0)
        assert est[big.id].at == at(60) and est[small.id].at == start, est


def test_a_later_job_that_fits_first_starts_first_as_in_the_real_loop() -> None:
    """The admission loop is greedy: at each cycle whatever fits starts, so a small job behind
    a gang takes the GPUs that come back before the gang fits, and the gang waits for them.
    4 GPUs come back at minute 30 and 4 at 60: the 4-GPU hour-long job starts at 30 and the
    8-GPU gang (not starving: no hold) only once that job ends, at 90. (A replay where nothing
    ever delays an earlier job said 60 for the gang and 120 for the small job: both wrong.)"""
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 4), (60, 4))
    big, small = _job(8, runtime_min=60), _job(4, runtime_min=60)
    _, est = _run(pool, big, small)
    assert est[small.id].at == at(30), est[small.id]
    assert est[big.id].at == at(90), est[big.id]


def test_a_starving_gang_holds_what_comes_back_until_it_fits() -> None:
    """The same queue, the gang waiting for two hours already (starving): from its first
    step it holds the free GPUs of its domain, so the small job does not start in front of it;
    the gang starts at 60 and the small job after the gang's hour, at 120."""
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 4), (60, 4))
    big = replace(_job(8, runtime_min=60), submitted_at=at(-120))
    small = _job(4, runtime_min=60)
    _, est = _run(pool, big, small)
    assert est[big.id].at == at(60), est[big.id]
    assert est[small.id].at == at(120), est[small.id]


def test_predicted_run_times_replace_declared_limits() -> None:
    """Jobs declaring 72 h here ran 1% of it (about 43 minutes): the job behind one such job
    is expected once that one's predicted run ends, not three days later."""
    from policies.run_length import RunSample, RuntimeModel

    hours = 72 * 3600.0
    model = RuntimeModel.learn([RunSample("x", hours, 0.01 * hours)] * 20)
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 8))
    first, second = _job(8, runtime_min=72 * 60), _job(8, runtime_min=72 * 60)
    inv = inventory(pool)
    result = admission_cycle([first, second], inv, QUOTAS, quota_usage(), T0)
    jobs = {first.id: first, second.id: second}
    plain = estimate(result.decisions, jobs, inv, T0)
    assert plain[second.id].at == at(30 + 72 * 60)
    est = estimate(result.decisions, jobs, inv, T0, model=model)
    assert est[first.id].at == at(30)
    assert est[second.id].at == at(30 + 0.01 * 72 * 60), est[second.id]
    assert "run times from 20 ended attempts" in est[second.id].method


def test_known_running_work_ends_at_its_predicted_end() -> None:
    """The release at minute 600 (a declared end) belongs to an attempt the broker predicts
    to end at minute 45: the waiting job starts then; a release nobody claims stays scaled by
    the factor only."""
    from policies.eta import Running

    pool = make_pool().shape(racks=1, nodes=1).release("n0", (600, 8))
    inv = inventory(pool)
    node = inv.pools[0].nodes[0].name
    job = _job(8)
    result = admission_cycle([job], inv, QUOTAS, quota_usage(), T0)
    mine = [Running(node, at(600), at(45))]
    assert estimate(result.decisions, {job.id: job}, inv, T0, running=mine)[job.id].at == at(45)
    other = [Running(node, at(400), at(45))]
    assert estimate(result.decisions, {job.id: job}, inv, T0, running=other)[job.id].at == at(600)


def test_a_gang_waiting_on_a_known_release_keeps_its_estimate_as_time_passes() -> None:
    """Issue 31's receding ETA: the gang's node is busy until 20:41:24 (the backend announces
    the release; the broker does not know when that work started), and history says runs take
    about 1% of what they declare. The estimate used to scale the time left to the release by
    that ratio, so every cycle put the start a few seconds ahead, rounded up to the next step:
    20:30:24 -> 20:31:25 -> 20:32:26, always a minute ahead. Cycles a minute apart must give
    the same start, the announced one."""
    from datetime import UTC, datetime, timedelta

    from policies.run_length import RunSample, RuntimeModel

    model = RuntimeModel.learn([RunSample("vision", 5400.0, 54.0, 16)] * 20)
    t0 = datetime(2026, 12, 4, 20, 29, 24, tzinfo=UTC)
    release = datetime(2026, 12, 4, 20, 41, 24, tzinfo=UTC)
    minutes = (release - T0).total_seconds() / 60
    gang = replace(_job(8, replicas=2, runtime_min=90), submitted_at=t0)
    pool = make_pool().shape(racks=1, nodes=2).release("n0", (minutes, 8)) \
        .release("n1", (minutes, 8))
    inv = inventory(pool)
    seen = []
    for cycle in range(3):
        now = t0 + timedelta(seconds=61 * cycle)
        result = admission_cycle([gang], inv, QUOTAS, quota_usage(), now)
        assert not result.by_job()[gang.id].admitted
        e = estimate(result.decisions, {gang.id: gang}, inv, now,
                     runtime_factor=model.factor(), model=model)[gang.id]
        seen.append(e.at)
    assert seen == [release] * 3, seen


def _spread_model():
    """8 h jobs ran 10% to 90% of their limit here (an even spread): a run of the mean is
    4 h, the window's quantiles 0.1 and 0.9 of the ratios 18% and 82% (1.44 h, 6.56 h)."""
    from policies.run_length import RunSample, RuntimeModel

    ratios = [0.1 + 0.8 * i / 19 for i in range(20)]
    return RuntimeModel.learn([RunSample("vision", 8 * 3600.0, r * 8 * 3600.0) for r in ratios])


def test_a_start_behind_a_run_of_uncertain_length_gets_a_window_around_it() -> None:
    """The node comes back at minute 30; the first job starts then and runs 8 h at most, 4 h
    on the mean of history: the second starts at 4.5 h on the point estimate. Projected with
    short (quantile 0.1) and long (0.9) runs the start moves to 30 + 86.4 and 30 + 393.6
    minutes;
    the window stretches those (SPREAD: the late end by 1.5 from now, the early one by 0.6)
    and states its coverage. The first job's start does not depend on run lengths: its window
    is the announced release, stretched."""
    from policies.eta import SPREAD

    model = _spread_model()
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 8))
    first, second = _job(8, runtime_min=480), _job(8, runtime_min=480)
    inv = inventory(pool)
    result = admission_cycle([first, second], inv, QUOTAS, quota_usage(), T0)
    est = estimate(result.decisions, {first.id: first, second.id: second}, inv, T0,
                   model=model)
    e = est[second.id]
    assert e.at == at(30 + 240), e
    assert e.window is not None and e.window.coverage == SPREAD.coverage == 0.8
    assert e.window.earliest == at(SPREAD.early_stretch * (30 + 86.4))
    assert e.window.latest == at(SPREAD.late_stretch * (30 + 393.6))
    w = est[first.id].window
    assert w is not None and w.earliest <= at(30) <= w.latest and est[first.id].at == at(30)


def test_without_run_length_history_there_is_no_window() -> None:
    """No spread to project: the point estimate stands alone (no made-up window)."""
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (30, 8))
    first, second = _job(8), _job(8)
    _, est = _run(pool, first, second)
    assert est[second.id].at == at(90) and est[second.id].window is None


def test_running_work_of_uncertain_length_moves_the_window_not_the_point() -> None:
    """An 8 h job 1 h into its run: the point waits for the mean of the longer runs, the
    window for their 10% and 90% quantiles (policies.eta.running)."""
    from policies.eta import SPREAD, running

    model = _spread_model()
    pool = make_pool().shape(racks=1, nodes=1).release("n0", (7 * 60, 8))
    inv = inventory(pool)
    node = inv.pools[0].nodes[0].name
    job = _job(8)
    result = admission_cycle([job], inv, QUOTAS, quota_usage(), T0)
    mine = [running(node, at(-60), 8 * 3600.0, "vision", 8, model, T0)]
    e = estimate(result.decisions, {job.id: job}, inv, T0, model=model, running=mine)[job.id]
    later = [r for r in (0.1 + 0.8 * i / 19 for i in range(20)) if r > 1 / 8]
    mean_end = sum(later) / len(later) * 8 * 60 - 60
    assert e.at == at(mean_end), e
    assert e.window is not None
    assert e.window.earliest < e.at < e.window.latest
    assert e.window.latest <= at(SPREAD.late_stretch * (0.9 * 8 * 60 - 60))


def test_running_ends_kept_from_an_earlier_cycle_give_what_a_fresh_prediction_gives() -> None:
    """broker/control/eta_inputs.py keeps a running attempt's ends across cycles while their
    ratios cover the time it has run: an attempt's predicted ends are its start plus the run
    predicted for it, which do not move from cycle to cycle, and never less than a second
    from now (work that outran its prediction is expected any moment, not in the past)."""
    from datetime import timedelta

    from policies.eta import running, running_at, running_ends

    model = _spread_model()
    started = at(-60)
    kept = running_ends(started, 8 * 3600.0, "vision", 8, model, T0)
    covered = 0
    for minutes in range(0, 8 * 60, 5):
        now = T0 + timedelta(minutes=minutes)
        fresh = running("n0", started, 8 * 3600.0, "vision", 8, model, now)
        assert fresh.predicted_end >= now + timedelta(seconds=1)
        assert fresh.declared_end == started + timedelta(hours=8)
        if kept.ratios.covers(8 * 3600.0, (now - started).total_seconds()):
            covered += 1
            assert running_at("n0", kept, now) == fresh, minutes
    assert 0 < covered < 8 * 60 // 5  # kept for a while, then predicted again
    # past every end: each clamped to a second from now
    late = T0 + timedelta(hours=7, minutes=59)
    last = running_ends(started, 8 * 3600.0, "vision", 8, model, late)
    assert last.clamped(late)
    assert running_at("n0", last, late).early_end == late + timedelta(seconds=1)
