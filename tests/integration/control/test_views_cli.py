"""`isthmus pools`, `quotas`, `report usage`, `decisions` and `admin cycles` against the API
on the simulated federation (the CLI's client talks to the app in-process)."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

import broker.cli.common as common
import broker.cli.main as cli
from broker.api.app import create_app
from tests.builders import spec
from tests.harness.inprocess import route_clients
from tests.harness.sim import Sim, run_until, submit


@pytest.fixture
def run(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> Any:
    app = create_app(sim.plane.config, sim.plane.db)
    app.state.runtime = SimpleNamespace(plane=sim.plane, wake=lambda name: None)

    route_clients(monkeypatch, common, app)

    def invoke(*args: str) -> str:
        out = CliRunner().invoke(cli.app, list(args))
        assert out.exit_code == 0, out.output
        return out.output

    return invoke


def test_view_commands(sim: Sim, run: Any) -> None:
    job = submit(sim, spec().team("vision").flavors("h100-80g").replicas(2).gpus(8), 60)
    run_until(sim, job, "SUCCEEDED")
    pools = run("pools")
    assert "slurm-h100" in pools and "k8s-a100" in pools and "FOREIGN" in pools
    assert {p["name"] for p in json.loads(run("pools", "--json"))} == {"slurm-h100", "k8s-a100"}
    assert "vision" in run("quotas") and "language" in run("quotas")
    table = run("report", "usage", "--from", "2026-11-01", "--by", "team")
    assert "vision" in table and "total" in table
    rows = list(csv.reader(io.StringIO(run("report", "usage", "--by", "pool", "--csv"))))
    assert rows[0][0] == "pool" and [r[0] for r in rows[1:]] == ["slurm-h100", "total"]
    hours = json.loads(run("report", "usage", "--json"))["total"]["gpu_hours"]
    assert hours == pytest.approx(float(rows[-1][1]), rel=1e-5) and hours > 0
    assert "admitted to slurm-h100" in run("decisions", job)
    assert "DIGEST" in run("admin", "cycles", "--limit", "5")
    bad = CliRunner().invoke(cli.app, ["report", "usage", "--by", "rack"])
    assert bad.exit_code == 2 and "--by" in bad.output
