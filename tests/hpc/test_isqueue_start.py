"""isqueue --start shows the broker's estimated start of a waiting job (the ETA of its last
admission cycle), as squeue --start shows Slurm's; the drop-in talks to the app in-process."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

import broker.dropins.common as common
from broker.api.app import create_app
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.dropins import isqueue
from broker.orchestration.submission import submit_job
from broker.store.db import Database
from tests.builders import spec
from tests.harness.inprocess import route_clients
from tests.harness.sim import CONFIG, make_sim


def test_start_shows_the_estimated_start(db: Database, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sim = make_sim(db, parse_config(CONFIG))
    cfg = sim.plane.config
    submit_job(db, cfg, spec().flavors("a100-80g").replicas(6).topology(None).build(), "t")
    submit_job(db, cfg, spec().team("language").flavors("a100-80g").replicas(2)
               .topology(None).build(), "t")
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(30)  # the a100 pool is full for the running jobs' declared 2 hours
    waiting = submit_job(db, cfg, spec().name("waits").flavors("a100-80g").replicas(1)
                         .topology(None).build(), "t").job.id
    run_admission(sim.plane)
    app = create_app(cfg, db)

    route_clients(monkeypatch, common, app)
    env = {"ISTHMUS_URL": "http://testserver", "HOME": "/nonexistent"}
    eta = TestClient(app).get(f"/v1/jobs/{waiting}").json()["wait"]["estimated_start"]
    assert eta is not None
    shown = datetime.fromisoformat(eta).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")

    assert isqueue.run(["--start", "-h", "-j", waiting], env) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert shown in line.split() and "PD" in line.split()
    assert isqueue.run(["--json", "-j", waiting], env) == 0
    (row,) = json.loads(capsys.readouterr().out)["jobs"]
    assert row["estimated_start"] == shown and row["start_time"] is None
