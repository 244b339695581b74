"""Timeline and logs of a job run on the simulated backends, through the API and the CLI."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.api.app import create_app
from broker.control.admission import ESTIMATE_EVERY_S, run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.orchestration.submission import submit_job
from tests.builders import spec
from tests.harness.sim import Sim


def _client(sim: Sim, control: bool = True) -> TestClient:
    runtime = SimpleNamespace(plane=sim.plane, leading=True, wake=lambda *_: None)
    return TestClient(create_app(sim.plane.config, sim.plane.db,
                                 runtime if control else None))  # type: ignore[arg-type]


def _cycle(sim: Sim, seconds: float = 20) -> None:
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(seconds)
    for name in sim.backends:
        run_reconcile(sim.plane, name)


def _run_to_end(sim: Sim, job_id: str, client: TestClient) -> dict[str, Any]:
    for _ in range(200):
        _cycle(sim, 60)
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("SUCCEEDED", "FAILED"):
            return job
    pytest.fail("the simulated job did not end")


def _job(sim: Sim, replicas: int = 2) -> str:
    for b in sim.backends.values():  # ten minutes each, so that a test sees the end
        b._duration = lambda _rng: 600.0
    s = spec().flavors("a100-80g").replicas(replicas).topology(None).build()
    return submit_job(sim.plane.db, sim.plane.config, s, "t").job.id


def test_timeline_has_every_phase_of_an_attempt(sim: Sim) -> None:
    client = _client(sim)
    job_id = _job(sim)
    queued = client.get(f"/v1/jobs/{job_id}/timeline").json()
    assert [p["name"] for a in queued["attempts"] for p in a["phases"]] == ["queued"]
    assert queued["attempts"][0]["phases"][0]["end"] is None
    job = _run_to_end(sim, job_id, client)
    body = client.get(f"/v1/jobs/{job_id}/timeline").json()
    (attempt,) = body["attempts"]
    names = [p["name"] for p in attempt["phases"]]
    assert names[:4] == ["queued", "dispatch", "scheduling", "init"], names
    assert names[-1] in ("warm-up", "running")
    assert attempt["outcome"].startswith(job["state"])
    assert attempt["pool"] == "k8s-a100"
    for a, b in zip(attempt["phases"], attempt["phases"][1:], strict=False):
        assert a["end"] == b["start"]  # phases follow one another without gaps
        assert a["seconds"] >= 0
    assert attempt["phases"][-1]["end"] == attempt["ended_at"]


def test_logs_of_each_rank_from_the_simulator(sim: Sim) -> None:
    client = _client(sim)
    job_id = _job(sim, replicas=2)
    not_yet = client.get(f"/v1/jobs/{job_id}/logs")
    assert not_yet.status_code == 404 and "not been admitted" in not_yet.json()["detail"]
    _cycle(sim)
    body = client.get(f"/v1/jobs/{job_id}/logs").json()
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    assert all("started on" in r["text"] for r in body["ranks"]), body
    one = client.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1, "tail": 1}).json()
    assert [r["rank"] for r in one["ranks"]] == [1]
    assert one["ranks"][0]["text"].count("\n") == 1
    assert client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2}).status_code == 404
    off = _client(sim, control=False).get(f"/v1/jobs/{job_id}/logs")
    assert off.status_code == 503 and "--no-control" in off.json()["detail"]


def test_logs_of_an_attempt_without_backend_object(sim: Sim) -> None:
    client = _client(sim)
    job_id = _job(sim)
    run_admission(sim.plane)  # admitted, not dispatched
    answer = client.get(f"/v1/jobs/{job_id}/logs")
    assert answer.status_code == 404 and "no backend object" in answer.json()["detail"]


class _Local:
    """broker.client.Client answering from an in-process app."""

    client: TestClient

    def __init__(self, *a: object, **k: object) -> None:
        from broker.client import Client
        from tests.harness.inprocess import over_app

        self._c = over_app(Client("http://in-process"), self.client)

    def __enter__(self) -> Any:
        return self._c

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def cli(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> Any:
    import broker.cli.common as common
    import broker.cli.main as main

    _Local.client = _client(sim)
    monkeypatch.setattr(common, "Client", _Local)
    runner = CliRunner()
    return lambda *args: runner.invoke(main.app, list(args))


def test_cli_timeline_logs_attempts(sim: Sim, cli: Any) -> None:
    job_id = _job(sim)
    _cycle(sim)
    out = cli("timeline", job_id)
    assert out.exit_code == 0, out.output
    assert "attempt 1 on k8s-a100" in out.output and "queued" in out.output
    assert "#" in out.output  # the bar chart
    out = cli("logs", job_id, "--rank", "0")
    assert out.exit_code == 0, out.output
    assert "rank 0: started on" in out.output and "rank 1" not in out.output
    out = cli("attempts", job_id)
    assert out.exit_code == 0 and "k8s-a100" in out.output, out.output
    out = cli("list", "--state", "running", "--state", "queued,Preparing")
    assert out.exit_code == 0, out.output
    out = cli("list", "--state", "sleeping")
    assert out.exit_code == 2 and "not a state" in out.output


def test_cli_plan_and_status_show_the_wait(sim: Sim, cli: Any, tmp_path: Any) -> None:
    import yaml

    def write(name: str, s: Any) -> str:
        (tmp_path / name).write_text(yaml.safe_dump(s.topology(None).build().model_dump(
            mode="json", exclude_none=True)))
        return str(tmp_path / name)

    big = write("big.yaml", spec().flavors("a100-80g").replicas(7))  # 56 of 64 GPUs
    small = write("small.yaml", spec().team("language").flavors("a100-80g").replicas(2))
    out = cli("plan", "-f", big)
    assert out.exit_code == 0, out.output
    assert "plan: admitted" in out.output and "placement: k8s-a100" in out.output
    first = cli("submit", "-f", big, "--json")
    _cycle(sim)
    out = cli("plan", "-f", small)
    assert "plan: waiting - InsufficientCapacity" in out.output, out.output
    assert "estimated start" in out.output and "jobs queued ahead of it: 0" in out.output
    second = cli("submit", "-f", small, "--json")
    assert first.exit_code == 0 and second.exit_code == 0
    import json

    waiting = json.loads(second.output)["id"]
    run_admission(sim.plane)
    out = cli("status", waiting)
    assert out.exit_code == 0, out.output
    assert "position" in out.output and "estimated start" in out.output, out.output
    # the queue is estimated again ESTIMATE_EVERY_S later: a job that starts to wait in
    # between is shown as not estimated yet, then gets its estimate
    third = json.loads(cli("submit", "-f", small, "--json").output)["id"]
    sim.advance(ESTIMATE_EVERY_S / 3)
    run_admission(sim.plane)
    out = cli("status", third)
    assert "estimated start  not estimated yet" in out.output, out.output
    assert "position" not in out.output, out.output
    sim.advance(ESTIMATE_EVERY_S)
    run_admission(sim.plane)
    out = cli("status", third)
    assert "position" in out.output and "not estimated yet" not in out.output, out.output
    listed = cli("list", "--json")
    items = {j["id"]: j for j in json.loads(listed.output)["items"]}
    wait = items[waiting]["wait"]
    assert wait["position"] == 1 and wait["estimate_method"].startswith("releases")
    assert datetime.fromisoformat(wait["estimated_start"]) > sim.clock.now


def test_cli_render_and_explain_say_what_is_missing(sim: Sim, cli: Any) -> None:
    job_id = _job(sim)
    out = cli("render", job_id)
    assert out.exit_code == 1 and "never admitted" in out.output
    run_admission(sim.plane)
    out = cli("render", job_id)
    assert out.exit_code == 1 and "has no backend object" in out.output
    too_big = spec().flavors("a100-80g").replicas(64).build()
    rejected = submit_job(sim.plane.db, sim.plane.config, too_big, "t").job
    out = cli("explain", rejected.id)
    assert out.exit_code == 0 and "REJECTED" in out.output and "rejected when validated" in \
        out.output, out.output
