"""Explain: the latest admission verdicts of a waiting job, through the API and the CLI."""

from __future__ import annotations

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.orchestration.submission import submit_job
from tests.builders import spec
from tests.harness.sim import Sim


def test_waiting_job_explains_itself(sim: Sim) -> None:
    cfg, db = sim.plane.config, sim.plane.db
    # the first gang takes all 32 h100 GPUs (and vision's whole h100 quota): the second waits
    first = spec().flavors("h100-80g").replicas(4).topology(None).build()
    submit_job(db, cfg, first, "t")
    big = submit_job(db, cfg, spec().name("second").flavors("h100-80g").topology(None).build(),
                     "t").job
    client = TestClient(create_app(cfg, db))
    before = client.get(f"/v1/jobs/{big.id}/explain").json()
    assert before["explanation"] is None and before["reason"] == "WaitingForAdmission"
    run_admission(sim.plane)
    body = client.get(f"/v1/jobs/{big.id}/explain").json()
    exp = body["explanation"]
    assert body["state"] == "QUEUED" and body["reason"] == exp["reason"]
    assert exp["admitted"] is False
    assert exp["reason"] in ("QuotaExhausted", "InsufficientCapacity", "HigherPriorityAhead",
                             "FairShareBehind"), exp
    assert body["message"] == exp["message"]
    assert exp["most_severe"] in ("QuotaExhausted", "InsufficientCapacity"), exp


def test_cli_explain(sim: Sim, monkeypatch: object) -> None:
    import broker.cli.common as common
    import broker.cli.main as cli

    cfg, db = sim.plane.config, sim.plane.db
    job = submit_job(db, cfg, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    client = TestClient(create_app(cfg, db))

    class Local:
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def __enter__(self) -> Local:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def explain(self, job_id: str) -> dict[str, object]:
            return client.get(f"/v1/jobs/{job_id}/explain").json()

    monkeypatch.setattr(common, "Client", Local)  # type: ignore[attr-defined]
    out = CliRunner().invoke(cli.app, ["explain", job.id])
    assert out.exit_code == 0, out.output
    assert f"job {job.id}: admitted - Admitted" in out.output
    assert "placement: slurm-h100 on slurm/sim-slurm, flavor h100-80g" in out.output
