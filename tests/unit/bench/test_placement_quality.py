"""bench/placement_quality.py's verdict: issue 30's three figures per strategy (small-job p95
wait, large-gang p95 wait, allocation), Isthmus against every fair baseline on all three at
once, and the headline over several seeds."""

from __future__ import annotations

import pytest

from backends.sim.trace import TraceJob
from bench import placement_quality as pq


def _job(i: int, gpus: int) -> TraceJob:
    replicas, per = (gpus // 8, 8) if gpus > 8 else (1, gpus)
    return TraceJob(f"j{i}", "team0", 1.0, replicas, per, 60.0, ("h100",), gpus > 8)


# 20 small jobs (1, 2, 4 and 8 GPUs: one node at most), 4 of 16 GPUs (neither small nor
# large), 20 large gangs (32 and 64 GPUs: >= half of the largest, 64)
TRACE = (
    [_job(i, (1, 2, 4, 8)[i % 4]) for i in range(20)]
    + [_job(20 + i, 16) for i in range(4)]
    + [_job(24 + i, (32, 64)[i % 2]) for i in range(20)]
)


def _metrics(name: str, small_p95_min: float, large_p95_h: float, alloc: float) -> pq.Metrics:
    """19 of 20 small jobs wait 30 s and one `small_p95_min`, so the nearest-rank p95 is that
    one; likewise the large gangs with 1 h and `large_p95_h`; the 16-GPU jobs wait 100 h, which
    neither figure may see."""
    m = pq.Metrics(name)
    m.waits = {f"j{i}": 30.0 for i in range(19)} | {"j19": small_p95_min * 60}
    m.waits |= {f"j{20 + i}": 100 * 3600.0 for i in range(4)}
    m.waits |= {f"j{24 + i}": 3600.0 for i in range(19)} | {"j43": large_p95_h * 3600}
    m.alloc = [alloc]
    return m


def _run(seed: int, load: float, isthmus: tuple[float, float, float],
         **base: tuple[float, float, float]) -> pq.RunResult:
    res = {"isthmus": _metrics("isthmus", *isthmus)}
    res |= {n: _metrics(n, *v) for n, v in base.items()}
    return pq.RunResult(seed, load, TRACE, res)


def test_small_jobs_fit_one_node_and_large_gangs_are_half_the_largest_or_more() -> None:
    m = _metrics("isthmus", 5.0, 20.0, 0.7)
    assert pq.SMALL_MAX_GPUS == 8
    small, large = m.small_waits(TRACE), m.big_waits(TRACE)
    assert len(small) == 20 and len(large) == 20  # the 16-GPU jobs are in neither
    assert max(small) == 5 * 60 and max(large) == 20 * 3600
    f = m.goal_figures(TRACE)
    assert f == pq.GoalFigures(small_p95_s=300.0, large_p95_s=72000.0, alloc=0.7)


def test_a_job_that_never_started_is_in_neither_p95() -> None:
    m = _metrics("isthmus", 5.0, 20.0, 0.7)
    del m.waits["j19"], m.waits["j43"]
    assert m.goal_figures(TRACE) == pq.GoalFigures(30.0, 3600.0, 0.7)


def test_p95_is_nearest_rank_like_pct() -> None:
    w = [float(i) for i in range(1, 101)]
    m = pq.Metrics("x", waits={str(i): x for i, x in enumerate(w)})
    assert pq.p95(w) == m.pct(0.95) == 96.0
    assert pq.p95([]) == 0.0


@pytest.mark.parametrize(
    ("isthmus", "base", "worse"),
    [
        pytest.param((1.0, 20.0, 0.70), (1.0, 20.0, 0.70), [], id="equal-is-not-worse"),
        pytest.param((0.5, 10.0, 0.80), (1.0, 20.0, 0.70), [], id="better-on-all"),
        pytest.param((3.0, 10.0, 0.80), (1.0, 20.0, 0.70),
                     ["small-job p95 3.0 vs 1.0 min (+120 s)"], id="small-worse"),
        pytest.param((1.5, 10.0, 0.80), (1.0, 20.0, 0.70),
                     ["small-job p95 1.5 vs 1.0 min (+30 s, within one cycle)"],
                     id="small-worse-within-one-cycle-still-worse"),
        pytest.param((0.5, 21.0, 0.80), (1.0, 20.0, 0.70),
                     ["large-gang p95 21.0 vs 20.0 h (+1.0 h)"], id="large-worse"),
        pytest.param((0.5, 10.0, 0.68), (1.0, 20.0, 0.70),
                     ["allocation 68.0% vs 70.0% (-2.0 pt)"], id="allocation-lower"),
        pytest.param((2.0, 30.0, 0.60), (1.0, 20.0, 0.70),
                     ["small-job p95 2.0 vs 1.0 min (+60 s, within one cycle)",
                      "large-gang p95 30.0 vs 20.0 h (+10.0 h)",
                      "allocation 60.0% vs 70.0% (-10.0 pt)"], id="worse-on-all"),
    ],
)
def test_worse_than_names_each_figure_that_is_worse_and_by_how_much(
    isthmus: tuple[float, float, float], base: tuple[float, float, float], worse: list[str]
) -> None:
    r = _run(3, 1.0, isthmus, kueue=base)
    assert r.worse_than("kueue") == worse
    assert r.goal_met is (not worse)


def test_goal_needs_isthmus_not_worse_than_every_fair_baseline() -> None:
    # better than kueue and static on all three, but greedy's large gangs wait less
    r = _run(3, 1.3, (1.0, 20.0, 0.78), kueue=(2.0, 40.0, 0.70), static=(60.0, 70.0, 0.70),
             greedy=(5.0, 19.0, 0.70))
    assert not r.goal_met
    assert r.worse_than("kueue") == [] and r.worse_than("static") == []
    # firstfit spreads rack-bound gangs: not a fair baseline, it cannot fail the goal
    r = _run(3, 1.3, (1.0, 20.0, 0.78), kueue=(2.0, 40.0, 0.70), firstfit=(0.5, 10.0, 0.9))
    assert r.goal_met
    assert "not worse on any" in r.rows().splitlines()[1]  # kueue's row
    assert r.rows().splitlines()[2].endswith("| firstfit | 0.5 min | 10.0 h | 90.0% |  |")


def test_waits_within_a_tie_count_as_equal_only_when_asked() -> None:
    r = _run(3, 1.0, (1.9, 20.0, 0.8), kueue=(1.0, 20.0, 0.8))
    assert not r.goal_met
    assert r.goal_met_within(60.0)
    assert not _run(3, 1.0, (2.1, 20.0, 0.8), kueue=(1.0, 20.0, 0.8)).goal_met_within(60.0)
    # a tie on waits never excuses a lower allocation
    assert not _run(3, 1.0, (1.0, 20.0, 0.79), kueue=(1.0, 20.0, 0.8)).goal_met_within(60.0)


def test_best_baseline_excludes_firstfit_and_ratio_uses_it() -> None:
    """The all-job p95 ratio of the goal before issue 30, still printed for reference."""
    trace = [_job(i, 1) for i in range(20)]

    def m(name: str, p95_min: float) -> pq.Metrics:
        return pq.Metrics(name, waits={f"j{i}": 30.0 for i in range(19)} | {"j19": p95_min * 60})

    res = {n: m(n, x) for n, x in
           (("isthmus", 4.0), ("firstfit", 1.0), ("kueue", 5.0), ("greedy", 40.0))}
    r = pq.RunResult(3, 1.3, trace, res)
    assert r.best == "kueue"
    assert r.ratio == pytest.approx(0.8)


def test_headline_counts_runs_per_baseline_and_names_the_figures_worse() -> None:
    runs = [
        _run(3, 1.0, (1.0, 20.0, 0.8), kueue=(2.0, 30.0, 0.7), static=(9.0, 90.0, 0.6)),
        _run(4, 1.0, (3.0, 20.0, 0.8), kueue=(2.0, 30.0, 0.7), static=(9.0, 90.0, 0.6)),
        _run(5, 1.3, (3.0, 20.0, 0.6), kueue=(2.0, 30.0, 0.7), static=(9.0, 90.0, 0.6)),
    ]
    lines = pq.aggregate(runs)
    assert lines[-1] == (
        "placement: isthmus not worse on small-job p95, large-gang p95 and allocation at once "
        "than static in 3 of 3; kueue in 1 of 3 (worse on small-job in 2, allocation in 1); "
        "goal met in 1 of 3 runs (2 with waits within one 60 s cycle counted as equal; "
        "seeds 3,4,5 x loads 100%,130%)"
    )
    assert lines[0].startswith("load 100%: goal met in 1 of 2;")
    assert lines[1].startswith("load 130%: goal met in 0 of 1;")
    assert lines[2].startswith("all runs: goal met in 1 of 3;")
