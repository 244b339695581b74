"""Concurrency limits per team and per user (issue 33): running jobs and GPUs held are checked
at admission (the job waits QUEUED with ConcurrencyLimit naming the limit, also within one
cycle), queued jobs at submit (429 problem+json naming the limit); `GET /v1/limits` shows them
against their counts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backends.sim.backend import DURATION_ENV
from broker.api.app import create_app
from broker.config import ConfigError, IsthmusConfig, parse_config
from broker.orchestration.submission import submit_job
from broker.store.queries import get_job
from tests.builders import SpecBuilder, spec
from tests.harness.sim import CONFIG, Sim, consistent, cycle, run_until, state


def _config(team: dict[str, Any] | None = None, user: dict[str, Any] | None = None,
            team_users: dict[str, Any] | None = None) -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    vision = next(t for t in raw["teams"] if t["name"] == "vision")
    if team is not None:
        vision["limits"] = team
    if team_users is not None:
        vision["user_limits"] = team_users
    if user is not None:
        raw["user_limits"] = user
    return parse_config(raw)


def _small(name: str) -> SpecBuilder:
    return spec().name(name).flavors("a100-80g").replicas(1).gpus(2).topology(None)


def _submit(sim: Sim, builder: SpecBuilder, user: str = "tester", duration: float = 60) -> str:
    s = builder.build()
    s = s.model_copy(update={"env": {**s.env, DURATION_ENV: str(duration)}})
    return submit_job(sim.plane.db, sim.plane.config, s, user).job.id


@pytest.mark.parametrize("sim_config", [_config(team={"running_jobs": 1})], indirect=False)
def test_a_team_runs_no_more_jobs_than_its_limit(sim: Sim) -> None:
    """Both jobs are submitted before the first cycle: the limit holds within one cycle."""
    first = _submit(sim, _small("first"), duration=60)
    second = _submit(sim, _small("second"), duration=60)
    other = _submit(sim, _small("other").team("language"), duration=60)
    cycle(sim, 5)
    assert state(sim, first)[0] in ("ADMITTED", "PREPARING", "RUNNING")
    assert state(sim, second) == ("QUEUED", "ConcurrencyLimit")
    assert state(sim, other)[0] != "QUEUED"  # another team is not held back
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    explained = client.get(f"/v1/jobs/{second}/explain").json()
    assert explained["explanation"]["reason"] == "ConcurrencyLimit"
    assert "teams[vision].limits.running_jobs allows 1" in explained["message"]
    lines = {(v["scope"], v["team"], v["user"]): v for v in client.get("/v1/limits").json()}
    team = lines[("team", "vision", None)]
    assert (team["running_jobs"], team["running_jobs_limit"], team["queued_jobs"]) == (1, 1, 1)
    run_until(sim, first, "SUCCEEDED", step=20)
    run_until(sim, second, "SUCCEEDED", step=20)
    consistent(sim)


@pytest.mark.parametrize("sim_config", [_config(user={"gpus": 4})], indirect=False)
def test_a_user_holds_no_more_gpus_than_the_user_limit(sim: Sim) -> None:
    mine = [_submit(sim, _small(f"mine-{i}"), user="ann", duration=600) for i in range(3)]
    theirs = _submit(sim, _small("theirs"), user="ben", duration=600)
    cycle(sim, 5)
    states = [state(sim, j) for j in mine]
    assert sum(1 for st, _ in states if st != "QUEUED") == 2  # 2 x 2 GPUs of ann's 4
    blocked = next(j for j, (st, _) in zip(mine, states, strict=True) if st == "QUEUED")
    assert state(sim, blocked)[1] == "ConcurrencyLimit"
    with sim.plane.db.read() as s:
        job = get_job(s, blocked)
        assert job is not None and "user_limits.gpus allows 4" in job.message
    assert state(sim, theirs)[0] != "QUEUED"  # ben has his own 4


@pytest.mark.parametrize("sim_config", [_config(team={"queued_jobs": 5},
                                                team_users={"queued_jobs": 2})],
                         indirect=False)
def test_queued_jobs_are_limited_at_submit_with_a_429(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    body = _small("q").dict()
    keyed = {"Idempotency-Key": "k1"}
    assert client.post("/v1/jobs", json=body, headers=keyed).status_code == 201
    assert client.post("/v1/jobs", json=body).status_code == 201
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 429, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"]
    problem = r.json()
    assert problem["type"].endswith(":concurrency-limit")
    assert problem["errors"][0]["field"] == "teams[vision].user_limits.queued_jobs"
    assert "has 2 jobs waiting" in problem["detail"]
    # a replay of a stored submission adds no job: never refused
    assert client.post("/v1/jobs", json=body, headers=keyed).status_code == 200
    documented = client.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]["responses"]
    assert "429" in documented
    # the team's limit counts every user's waiting jobs
    for user in ("ann", "ben", "cid"):
        _submit(sim, _small(f"by-{user}"), user=user)
    r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k2"})
    assert r.status_code == 429
    assert r.json()["errors"][0]["field"] == "teams[vision].limits.queued_jobs"


def test_limits_are_bounded_and_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as exc:
        _config(team={"running_jobs": -1})
    assert "teams[0].limits.running_jobs" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        _config(user={"gpus": 10**12})
    assert "user_limits.gpus" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        _config(team={"runing_jobs": 1})
    assert "teams[0].limits.runing_jobs" in str(exc.value)
