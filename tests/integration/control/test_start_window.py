"""The start window (policies/eta.py) from the real admission cycle to every surface: the API's
`wait.start_window`, `isthmus status/list` (their rendering), `explain`, `isqueue --start`,
`POST /v1/plan` (`isthmus plan`, `isbatch --test-only`) and the dashboard's job and queue
pages. History first: eight 2 h jobs that ran 10 to 80 minutes
teach the run-time model its spread; then the a100 pool is filled and a job waits."""

from __future__ import annotations

import io
from datetime import datetime
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

import broker.dropins.common as common
from broker.cli import output
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.dropins import isbatch, isqueue
from broker.store.db import Database
from broker.web import build_app
from policies.eta import SPREAD
from policies.explain import Explanation
from policies.run_length import MIN_SAMPLES
from tests.builders import spec
from tests.harness.inprocess import route_clients
from tests.harness.sim import CONFIG, make_sim, run_until, submit


def _rendered(table: object) -> str:
    console = Console(width=200, file=io.StringIO())
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_a_waiting_job_shows_its_likely_start_window_everywhere(
        db: Database, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sim = make_sim(db, parse_config(CONFIG))
    a100 = spec().flavors("a100-80g").topology(None)
    done = [submit(sim, a100.replicas(1), duration=600 * (i + 1)) for i in range(MIN_SAMPLES)]
    for job_id in done:
        run_until(sim, job_id, "SUCCEEDED", cycles=200, step=60)
    submit(sim, a100.replicas(6), duration=3600)
    submit(sim, spec().team("language").flavors("a100-80g").replicas(2).topology(None),
           duration=3600)
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(30)  # the a100 pool is full for the running jobs' declared 2 hours
    waiting = submit(sim, spec().name("waits").flavors("a100-80g").replicas(1).topology(None))
    run_admission(sim.plane)

    runtime = SimpleNamespace(plane=sim.plane, leading=True, wake=lambda *_: None)
    app = build_app(sim.plane.config, db, runtime)  # type: ignore[arg-type]
    client = TestClient(app)
    job = client.get(f"/v1/jobs/{waiting}").json()
    wait = job["wait"]
    assert wait["estimated_start"] is not None and "run times from" in wait["estimate_method"]
    window = wait["start_window"]
    assert window is not None and window["coverage"] == SPREAD.coverage
    earliest, latest, point = (datetime.fromisoformat(window["earliest"]),
                               datetime.fromisoformat(window["latest"]),
                               datetime.fromisoformat(wait["estimated_start"]))
    assert earliest < point < latest, window

    detail = _rendered(output.job_detail(job))  # isthmus status
    assert "likely " in detail and "(80%)" in detail, detail
    assert "likely " in output.wait_cell(job)  # isthmus list's QUEUE/ETA column
    x = Explanation.model_validate(
        client.get(f"/v1/jobs/{waiting}/explain").json()["explanation"])
    assert "likely " in x.to_text()  # isthmus explain

    route_clients(monkeypatch, common, app)
    env = {"ISTHMUS_URL": "http://testserver", "HOME": "/nonexistent"}
    assert isqueue.run(["--start", "-j", waiting], env) == 0
    out = capsys.readouterr().out
    header, line = out.splitlines()
    assert header.split()[-1] == "LIKELY_START" and "likely " in line, out

    body = spec().name("what-if").flavors("a100-80g").replicas(1).topology(None).build()
    plan = client.post("/v1/plan", json=body.model_dump(mode="json")).json()
    assert plan["start_window"] is not None, plan  # isthmus plan, isbatch --test-only
    assert any("likely " in line for line in isbatch.plan_lines(
        body.model_dump(mode="json"), plan))

    page = client.get(f"/ui/jobs/{waiting}").text
    assert 'id="job-eta-window"' in page and "likely " in page
    assert "likely " in client.get("/ui/queue").text
