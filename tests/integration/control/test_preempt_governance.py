"""Governance of priority preemption (issue 33): a job running within its team's nominal quota
is guaranteed against other teams' priority classes, unless a class may preempt across teams;
a team may use only the classes it is allowed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from broker.config import IsthmusConfig, parse_config
from broker.domain.spec import JobSpec
from broker.feasibility import request_problems
from tests.builders import spec
from tests.harness.sim import CONFIG, Sim, cycle, run_until, state, submit


def _config(**high: Any) -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    # quota is not what binds: vision may use 32 H100 GPUs, language 16 (all of it its own),
    # in a pool of 32
    nominal = {"vision": 32, "language": 16}
    for team in raw["teams"]:
        team["quotas"]["h100-80g"] = {"nominal": nominal[team["name"]]}
    raw["priority_classes"] = [
        {"name": "low", "value": 0}, {"name": "normal", "value": 100},
        {"name": "high", "value": 1000, "preempting": True, **high},
    ]
    return parse_config(raw)


def _guaranteed_then_urgent(sim: Sim) -> tuple[str, str]:
    """Team language runs 16 H100 GPUs (its nominal quota) at low priority beside 16 of team
    vision's (high: not a victim of its own team); then vision asks for 16 more at high
    priority, in a pool with no GPU free."""
    theirs = submit(sim, spec().name("theirs").team("language").flavors("h100-80g")
                    .replicas(2).topology(None).set("priority", "low"), 3600)
    ours = submit(sim, spec().name("ours").team("vision").flavors("h100-80g")
                  .replicas(2).topology(None).set("priority", "high"), 3600)
    for j in (theirs, ours):
        run_until(sim, j, "RUNNING", step=20)
    assert state(sim, theirs)[0] == "RUNNING"
    cycle(sim, 700)  # past the default minimum run time before preemption
    urgent = submit(sim, spec().name("urgent").team("vision").flavors("h100-80g")
                    .replicas(2).topology(None).set("priority", "high"), 60)
    for _ in range(5):
        cycle(sim, 10)
    return theirs, urgent


@pytest.mark.parametrize("sim_config", [_config()], indirect=False)
def test_another_teams_guaranteed_job_is_not_preempted(sim: Sim) -> None:
    theirs, urgent = _guaranteed_then_urgent(sim)
    assert state(sim, theirs)[0] == "RUNNING"
    assert state(sim, urgent)[0] == "QUEUED"


@pytest.mark.parametrize("sim_config", [_config(preempt_across_teams=True)], indirect=False)
def test_a_class_allowed_across_teams_preempts_it(sim: Sim) -> None:
    theirs, urgent = _guaranteed_then_urgent(sim)
    assert state(sim, theirs) != ("RUNNING", "Running")
    run_until(sim, urgent, "RUNNING", step=10)


def test_a_team_may_use_only_the_classes_it_is_allowed() -> None:
    config = _config(teams=["language"])
    job = JobSpec.model_validate(
        spec().name("x").team("vision").flavors("h100-80g").set("priority", "high")
        .build().model_dump())
    problems = request_problems(config, job, "vision")
    assert [p.field for p in problems] == ["priority"]
    assert problems[0].forbidden and "'high'" in problems[0].message
    assert "low, normal" in problems[0].message
    allowed = job.model_copy(update={"team": "language"})
    assert request_problems(config, allowed, "language") == []
