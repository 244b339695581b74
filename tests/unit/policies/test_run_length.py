"""Run-time prediction from history (policies/run_length.py)."""

from __future__ import annotations

import pytest

from policies.run_length import MIN_SAMPLES, RunSample, RuntimeModel

HOUR = 3600.0


def _samples(team: str, declared: float, ratios: list[float]) -> list[RunSample]:
    return [RunSample(team, declared, r * declared) for r in ratios]


def test_without_enough_history_the_declared_limit_stands() -> None:
    model = RuntimeModel.learn(_samples("a", HOUR, [0.5] * (MIN_SAMPLES - 1)))
    assert model.run_s("a", HOUR) == HOUR
    assert model.factor() == 1.0


def test_each_declared_limit_is_predicted_from_the_jobs_that_declared_it() -> None:
    """Jobs declaring 72 h (the cluster maximum, picked whatever the need) ran 1% of it; jobs
    declaring 1 h ran 80%. One ratio for all of them (the mean over both groups, 48%) would
    put both groups far off; the model gives each its own."""
    history = _samples("a", 72 * HOUR, [0.01] * 20) + _samples("b", HOUR, [0.8] * 30)
    model = RuntimeModel.learn(history)
    assert model.run_s("c", 72 * HOUR) == pytest.approx(0.01 * 72 * HOUR)
    assert model.run_s("c", HOUR) == pytest.approx(0.8 * HOUR)
    assert model.factor() == pytest.approx((20 * 0.01 + 30 * 0.8) / 50)  # one ratio for all


def test_a_team_with_its_own_history_of_a_limit_is_predicted_from_it() -> None:
    history = _samples("a", HOUR, [0.2] * 10) + _samples("b", HOUR, [0.9] * 30)
    model = RuntimeModel.learn(history)
    assert model.run_s("a", HOUR) == 0.2 * HOUR
    assert model.run_s("b", HOUR) == 0.9 * HOUR
    # a team without history: the limit's group, 10 at 20% and 30 at 90%
    assert model.run_s("new", HOUR) == pytest.approx((10 * 0.2 + 30 * 0.9) / 40 * HOUR)


def test_running_work_is_predicted_from_the_samples_that_ran_longer() -> None:
    """Half of the 8 h jobs ran 10%, half 75%; one that has run 2 h (25%) is one of the long
    ones: 6 h - 2 h = 4 h left, not what the whole group's mean would say (under an hour)."""
    model = RuntimeModel.learn(_samples("a", 8 * HOUR, [0.1] * 10 + [0.75] * 10))
    assert model.remaining_s("a", 8 * HOUR, 2 * HOUR) == 4 * HOUR
    # past every sample: expected at its declared end
    assert model.remaining_s("a", 8 * HOUR, 7 * HOUR) == HOUR


def test_samples_that_cannot_be_ratios_are_left_out() -> None:
    bad = [RunSample("a", 0.0, 10.0), RunSample("a", HOUR, -5.0)]
    model = RuntimeModel.learn(bad + _samples("a", HOUR, [0.5] * MIN_SAMPLES))
    assert model.samples == MIN_SAMPLES
    assert model.run_s("a", HOUR) == 0.5 * HOUR


def test_gangs_of_another_size_with_the_same_limit_are_predicted_apart() -> None:
    """Big gangs run longer (backends/sim/trace.py; Helios): 64-GPU jobs declaring 4 h ran
    90% of it, 1-GPU jobs declaring 4 h ran 10%. Grouped by limit alone, a 64-GPU job would be
    predicted at the mixed mean (about 23%); grouped by limit and size, at its own 90%; running
    work of that size likewise."""
    history = [RunSample(t, 4 * HOUR, 0.1 * 4 * HOUR, 1) for t in "abcd" * 10] + [
        RunSample(t, 4 * HOUR, 0.9 * 4 * HOUR, 64) for t in "abcd" * 3
    ]
    model = RuntimeModel.learn(history)
    assert model.run_s("e", 4 * HOUR, 64) == pytest.approx(0.9 * 4 * HOUR)
    assert model.run_s("e", 4 * HOUR, 1) == pytest.approx(0.1 * 4 * HOUR)
    assert model.remaining_s("e", 4 * HOUR, HOUR, 64) == pytest.approx(0.9 * 4 * HOUR - HOUR)
    # a size never seen with this limit: the limit's group
    assert model.run_s("e", 4 * HOUR, 8) == pytest.approx((40 * 0.1 + 12 * 0.9) / 52 * 4 * HOUR)


def test_quantiles_of_a_group_give_the_spread_of_its_runs() -> None:
    """1 h jobs ran 10%..100% here: the 0.1 and 0.9 quantiles (interpolated) bound the run,
    the mean stays the point; work 30 min in is predicted from the longer runs only."""
    ratios = [i / 10 for i in range(1, 11)]
    model = RuntimeModel.learn(_samples("a", HOUR, ratios))
    assert model.run_s("a", HOUR, q=0.1) == pytest.approx(0.19 * HOUR)
    assert model.run_s("a", HOUR, q=0.9) == pytest.approx(0.91 * HOUR)
    assert model.run_s("a", HOUR) == pytest.approx(0.55 * HOUR)
    # 30 min in: the runs longer than half (0.6..1.0), too few (5 < 8) for its group: declared
    assert model.remaining_s("a", HOUR, 0.5 * HOUR, q=0.9) == pytest.approx(0.5 * HOUR)
    many = RuntimeModel.learn(_samples("a", HOUR, ratios * 2))
    assert many.remaining_s("a", HOUR, 0.5 * HOUR, q=0.0) == pytest.approx(0.1 * HOUR)
    assert many.remaining_s("a", HOUR, 0.5 * HOUR, q=1.0) == pytest.approx(0.5 * HOUR)


@pytest.mark.parametrize("team, gpus", [("a", 8), ("a", 1), ("new", 8)],
                         ids=["own-group", "coarser-group", "no-team-history"])
def test_ratios_kept_from_an_earlier_time_run_predict_as_a_fresh_look_up_while_they_cover(
        team: str, gpus: int) -> None:
    """Running work is predicted every cycle from ratios looked up when it had run less
    (broker/control/eta_inputs.py keeps them): while `covers` says so they must give what a
    fresh look-up gives, and once the work has run past a sample's share they must not be
    used (the samples that ran longer are fewer, and the prediction moves)."""
    history = [RunSample("a", 8 * HOUR, r * 8 * HOUR, 8) for r in
               [0.1, 0.15, 0.2, 0.3, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9]] + \
              [RunSample("b", 8 * HOUR, r * 8 * HOUR, 1) for r in [0.05, 0.4, 0.45] * 4]
    model = RuntimeModel.learn(history)
    qs = (None, 0.1, 0.9)
    for start in range(0, 8 * 60, 7):  # minutes run when looked up
        kept = model.ratios_at(team, 8 * HOUR, start * 60.0, gpus, qs)
        covered = 0
        for later in range(start, 9 * 60, 3):
            fresh = model.remaining_at(team, 8 * HOUR, later * 60.0, gpus, qs)
            if kept.covers(8 * HOUR, later * 60.0):
                covered += 1
                assert kept.remaining(8 * HOUR, later * 60.0) == fresh, (start, later)
        assert covered >= 1
    # one share past a sample: not covered any more
    kept = model.ratios_at("a", 8 * HOUR, 0.25 * 8 * HOUR, 8, qs)
    assert kept.covers(8 * HOUR, 0.29 * 8 * HOUR)
    assert not kept.covers(8 * HOUR, 0.3 * 8 * HOUR)
    assert model.remaining_at("a", 8 * HOUR, 0.3 * 8 * HOUR, 8, qs) != \
        kept.remaining(8 * HOUR, 0.3 * 8 * HOUR)
