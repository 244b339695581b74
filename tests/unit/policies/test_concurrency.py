"""policies.concurrency: which limit blocks an admission (table-driven), charging within a
cycle, and the queued-jobs check at submit."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.domain.reasons import Reason
from policies.concurrency import Caps, ConcurrencyInputs, ConcurrencyState, Held, queued_problem
from policies.types import PendingJob

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def job(gpus: int = 8, team: str = "vision", user: str = "ann") -> PendingJob:
    return PendingJob(id="j", team=team, user=user, replicas=1, gpus_per_replica=gpus,
                      flavors=("a100",), submitted_at=NOW)


CASES = [
    ("no limits", ConcurrencyInputs(), None),
    ("team running jobs", ConcurrencyInputs(team_caps={"vision": Caps(running_jobs=2)},
                                            team_held={"vision": Held(2, 16)}),
     "teams[vision].limits.running_jobs allows 2"),
    ("team gpus", ConcurrencyInputs(team_caps={"vision": Caps(gpus=20)},
                                    team_held={"vision": Held(1, 16)}),
     "needs 8, teams[vision].limits.gpus allows 20"),
    ("team gpus fit exactly", ConcurrencyInputs(team_caps={"vision": Caps(gpus=24)},
                                                team_held={"vision": Held(1, 16)}), None),
    ("default user running jobs", ConcurrencyInputs(default_user=Caps(running_jobs=1),
                                                    user_held={("vision", "ann"): Held(1, 8)}),
     "user ann of team vision runs 1 jobs, user_limits.running_jobs allows 1"),
    ("another user is not counted", ConcurrencyInputs(
        default_user=Caps(running_jobs=1), user_held={("vision", "ben"): Held(1, 8)}), None),
    ("team's user limits", ConcurrencyInputs(user_caps={"vision": Caps(gpus=8)},
                                             user_held={("vision", "ann"): Held(1, 8)}),
     "teams[vision].user_limits.gpus allows 8"),
    ("zero stops the team", ConcurrencyInputs(team_caps={"vision": Caps(running_jobs=0)}),
     "allows 0"),
]


@pytest.mark.parametrize(("inputs", "named"), [(i, n) for _, i, n in CASES],
                         ids=[c[0] for c in CASES])
def test_the_limit_named(inputs: ConcurrencyInputs, named: str | None) -> None:
    got = ConcurrencyState(inputs).blocked(job())
    if named is None:
        assert got is None
    else:
        assert got is not None and got[0] is Reason.ConcurrencyLimit and named in got[1]


def test_admissions_of_a_cycle_are_charged() -> None:
    state = ConcurrencyState(ConcurrencyInputs(default_user=Caps(running_jobs=2, gpus=100)))
    state.charge(job())
    assert state.blocked(job()) is None
    state.charge(job())
    assert state.blocked(job()) is not None
    assert state.blocked(job(user="ben")) is None


def test_queued_jobs_at_submit() -> None:
    assert queued_problem(None, Caps(), "vision", "ann", 100, 100) is None
    field, msg = queued_problem(Caps(queued_jobs=3), Caps(), "vision", "ann", 3, 0) or ("", "")
    assert field == "teams[vision].limits.queued_jobs" and "has 3 jobs waiting" in msg
    assert queued_problem(None, Caps(queued_jobs=3), "vision", "ann", 9, 2) is None
    field, _ = queued_problem(None, Caps(queued_jobs=3), "vision", "ann", 9, 2, adding=2) \
        or ("", "")
    assert field == "user_limits.queued_jobs"  # an array of two tasks passes the limit
