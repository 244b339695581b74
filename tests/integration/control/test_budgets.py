"""GPU-hour budgets (issue 33), on both databases: a team past its budget waits QUEUED with
BudgetExhausted naming the budget, its period and when it renews, and is admitted again when the
period rolls over (by the injected database clock); `lowest` admits at the lowest priority
class; thresholds are told once (notice, metric) per budget, fraction and period; the views
(`GET /v1/budgets`, the usage report, explain) show them."""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backends.sim.backend import DURATION_ENV
from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.control.notices import run_notices
from broker.control.soft_state import SoftState
from broker.metrics import BudgetState
from broker.orchestration.submission import submit_job
from broker.store import notices as notice_store
from broker.store.db import Database
from broker.store.queries import job_events
from broker.views.budgets import read_budgets
from broker.web import build_app
from tests.builders import SpecBuilder, spec
from tests.harness.notice_sinks import Mailbox, Receiver
from tests.harness.sim import CONFIG, Sim, consistent, cycle, make_sim, run_until, state

DAY = {"period": "day", "gpu_hours": 1, "warn_at": [0.5]}


def _config(budgets: list[dict[str, Any]] | None = None,
            user_budgets: list[dict[str, Any]] | None = None) -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    vision = next(t for t in raw["teams"] if t["name"] == "vision")
    if budgets is not None:
        vision["budgets"] = budgets
    if user_budgets is not None:
        vision["user_budgets"] = user_budgets
    return parse_config(raw)


def _small(name: str, team: str = "vision") -> SpecBuilder:
    return spec().name(name).team(team).flavors("a100-80g").replicas(1).gpus(2).topology(None)


def _submit(sim: Sim, builder: SpecBuilder, user: str = "tester", duration: float = 60) -> str:
    s = builder.build()
    s = s.model_copy(update={"env": {**s.env, DURATION_ENV: str(duration)}})
    return submit_job(sim.plane.db, sim.plane.config, s, user).job.id


def _spend(sim: Sim, user: str = "tester") -> None:
    """Two GPUs for half an hour and more (preparing included): over a 1 GPU-hour budget."""
    first = _submit(sim, _small("spender"), user=user, duration=1800)
    run_until(sim, first, "SUCCEEDED", cycles=40, step=120)


def _budget_notices(sim: Sim) -> list[notice_store.Notice]:
    with sim.plane.db.read() as s:
        return [n for n in notice_store.unexpanded(s, 10_000) if n.kind == "budget_threshold"]


@pytest.mark.parametrize("sim_config", [_config(budgets=[DAY])], indirect=False)
def test_a_team_past_its_budget_waits_until_the_period_renews(
        sim: Sim, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="isthmus.control.budgets")
    _spend(sim)
    waiting = _submit(sim, _small("after"))
    other = _submit(sim, _small("other", team="language"))
    cycle(sim, 5)
    assert state(sim, waiting) == ("QUEUED", "BudgetExhausted")
    assert state(sim, other)[0] != "QUEUED"  # another team is not held back
    with sim.plane.db.read() as s:
        message = job_events(s, waiting)[-1].message
    assert message == ("the 1 GPU-hour day budget of team vision (teams[vision].budgets[day]) "
                       "is spent; it renews at 2026-11-30T00:00Z")

    # told once per fraction, however many cycles see it, also after a restart
    for _ in range(3):
        cycle(sim, 5)
    sim.plane.soft = SoftState()
    cycle(sim, 5)
    told = _budget_notices(sim)
    assert sorted(n.details["threshold"] for n in told) == [0.5, 1.0]
    assert {n.team for n in told} == {"vision"}
    assert "used" in told[0].details["message"] and told[0].details["period"] == "day"
    logged = [r.getMessage() for r in caplog.records if "budget threshold" in r.getMessage()]
    assert len(logged) == 2 and "team vision used" in logged[-1]

    # the metric, the view and explain, by the same clock
    families = {f.name: f for f in BudgetState(
        sim.plane.db, sim.plane.config, period_clock=lambda _c: sim.clock.now).collect()}
    [ratio] = families["isthmus_budget_threshold_ratio"].samples
    assert ratio.labels == {"team": "vision", "user": "", "period": "day"} and ratio.value == 1.0
    [used] = families["isthmus_budget_used_gpu_seconds"].samples
    assert used.value >= 3600
    [view] = read_budgets(sim.plane.config, sim.plane.db,
                          clock=lambda _c: sim.clock.now)
    assert (view.state, view.budget, view.reached) == ("spent", "teams[vision].budgets[day]",
                                                       [0.5, 1.0])
    app = build_app(sim.plane.config, sim.plane.db)
    app.state.period_clock = lambda _c: sim.clock.now
    client = TestClient(app)
    explained = client.get(f"/v1/jobs/{waiting}/explain").json()
    assert explained["reason"] == "BudgetExhausted"
    assert [b["budget"] for b in explained["budgets"]] == ["teams[vision].budgets[day]"]
    report = client.get("/v1/reports/usage").json()
    assert [b["budget"] for b in report["budgets"]] == ["teams[vision].budgets[day]"]
    assert [b["state"] for b in client.get("/v1/budgets").json()] == ["spent"]
    overview = client.get("/ui")
    assert overview.status_code == 200 and '<table id="budgets">' in overview.text
    assert '<tr class="budget-spent"><td>vision</td><td>(team)</td><td>day</td>' in overview.text

    # the what-if says the same, and stores nothing
    runtime = SimpleNamespace(plane=sim.plane, leading=True, wake=lambda *_: None)
    planner = TestClient(create_app(sim.plane.config, sim.plane.db, runtime))  # type: ignore[arg-type]
    plan = planner.post("/v1/plan", json=_small("what-if").build().model_dump(
        mode="json", exclude_none=True)).json()
    assert (plan["admitted"], plan["explanation"]["reason"]) == (False, "BudgetExhausted")

    # the next day (by the database's clock) the budget is whole again
    sim.plane.period_clock = lambda _conn: datetime(2026, 11, 30, 0, 5, tzinfo=UTC)
    cycle(sim, 5)
    assert state(sim, waiting)[0] != "QUEUED"
    run_until(sim, waiting, "SUCCEEDED", step=20)
    consistent(sim)


@pytest.mark.parametrize("sim_config", [_config(budgets=[{**DAY, "enforce": "lowest"}])],
                         indirect=False)
def test_lowest_enforcement_admits_at_the_lowest_class(sim: Sim) -> None:
    _spend(sim)
    urgent = _submit(sim, _small("urgent").set("priority", "high"))
    cycle(sim, 5)
    assert state(sim, urgent)[0] != "QUEUED"
    with sim.plane.db.read() as s:
        admitted = next(e for e in job_events(s, urgent) if e.to_state == "ADMITTED")
    assert "as priority class low, without preempting: the 1 GPU-hour day budget of team " \
        "vision" in admitted.message


def _medium() -> IsthmusConfig:
    """ann's user budget admits her jobs as `low` once spent; `medium` preempts below it."""
    raw = _config(user_budgets=[{**DAY, "enforce": "lowest"}]).model_dump(
        mode="json", exclude_none=True)
    raw["priority_classes"].append({"name": "medium", "value": 50, "preempting": True})
    return parse_config(raw)


@pytest.mark.parametrize("sim_config", [_medium()], indirect=False)
def test_a_job_admitted_as_the_lowest_class_is_preempted_as_it(sim: Sim) -> None:
    _spend(sim, user="ann")
    # ann's normal job (100) fills the a100 pool, admitted as low (0)
    big = _submit(sim, _small("big").replicas(8).gpus(8), user="ann", duration=3600)
    run_until(sim, big, "RUNNING", step=20)
    for _ in range(4):  # past the protection of a job that just started (min_runtime)
        cycle(sim, 200)
    # ben's medium job (50) of the same team finds no room: it may preempt only below 50
    urgent = _submit(sim, _small("urgent").gpus(8).set("priority", "medium"), user="ben")
    cycle(sim, 5)
    with sim.plane.db.read() as s:
        assert any(e.reason == "Preempted" for e in job_events(s, big)), state(sim, big)
    run_until(sim, urgent, "RUNNING", step=20)


@pytest.mark.parametrize("sim_config", [_config(user_budgets=[DAY])], indirect=False)
def test_a_user_budget_holds_back_that_user_only(sim: Sim) -> None:
    _spend(sim, user="ann")
    mine = _submit(sim, _small("mine"), user="ann")
    theirs = _submit(sim, _small("theirs"), user="ben")
    cycle(sim, 5)
    assert state(sim, mine) == ("QUEUED", "BudgetExhausted")
    assert state(sim, theirs)[0] != "QUEUED"
    with sim.plane.db.read() as s:
        assert "user ann of team vision (teams[vision].user_budgets[day])" in \
            job_events(s, mine)[-1].message


def test_threshold_notices_reach_a_webhook_and_a_mail_server(
        db: Database, receiver: Receiver, mailbox: tuple[Mailbox, int]) -> None:
    box, port = mailbox
    raw = _config(budgets=[DAY]).model_dump(mode="json", exclude_none=True)
    next(t for t in raw["teams"] if t["name"] == "vision")["notices"] = {
        "webhooks": [receiver.url], "emails": ["ops@example.org"]}
    raw["notices"] = {"smtp": {"host": "127.0.0.1", "port": port,
                               "sender": "isthmus@example.org"}}
    sim = make_sim(db, parse_config(raw))
    _spend(sim)
    cycle(sim, 5)
    for _ in range(3):
        run_notices(sim.plane)
    told = [body for body, _, _ in receiver.accepted if body["kind"] == "budget_threshold"]
    assert sorted(b["threshold"] for b in told) == [0.5, 1.0]
    spent = next(b for b in told if b["threshold"] == 1.0)
    assert (spent["team"], spent["budget"], spent["job_id"]) == (
        "vision", "teams[vision].budgets[day]", None)
    assert spent["renews_at"].startswith("2026-11-30T00:00")
    assert "enforced (stop) until 2026-11-30T00:00Z" in spent["message"]
    assert box.kinds().count("budget_threshold") == 2
