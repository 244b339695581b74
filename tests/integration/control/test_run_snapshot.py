"""Run snapshots complete enough to reproduce a run: what an attempt ran with (image digest
from the ranks, GPU models of its nodes, entrypoint hash, code and data versions) is resolved
once when its ranks start, kept beside the immutable snapshot, and exported per attempt. A
resubmission gets a snapshot of its own and never changes an exported one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.testclient import TestClient

from backends.base import Backend
from broker.api.app import create_app
from broker.domain.facts import Fact, Phase
from broker.orchestration.submission import submit_job
from broker.store.queries import get_job
from tests.builders import spec
from tests.harness.sim import Sim, cycle


class ReportsImages:
    """The simulated backend, with ranks that report an image ID and nodes a GPU model."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.image_id = "docker-pullable://reg.example/train@sha256:" + "a" * 64

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        return [f.model_copy(update={"image_ids": (self.image_id,) * len(f.nodes),
                                     "gpu_models": ("NVIDIA-H100-80GB-HBM3",)})
                if f.phase is Phase.RUNNING else f
                for f in self.inner.observe(names)]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def run_until(sim: Sim, job_id: str, state: str) -> None:
    for _ in range(30):
        cycle(sim, 5)
        with sim.plane.db.read() as s:
            job = get_job(s, job_id)
        assert job is not None
        if job.state == state:
            return
    raise AssertionError(f"job {job_id} never reached {state} (is {job and job.state})")


def _submit(sim: Sim, **fields: Any) -> str:
    data = spec().flavors("h100-80g").dict() | fields
    from broker.domain.spec import JobSpec
    return submit_job(sim.plane.db, sim.plane.config, JobSpec.model_validate(data), "t").job.id


def test_snapshot_export_resolves_once_and_a_resubmission_never_changes_it(sim: Sim) -> None:
    backend = ReportsImages(sim.plane.backends["sim-slurm"])
    sim.plane.backends = {**sim.plane.backends, "sim-slurm": backend}
    entry = {"image": "reg.example/train:latest", "command": ["python", "train.py"]}
    first = _submit(sim, entrypoint=entry, code_version="git:abc123", data_version="ds:v1",
                    max_runtime="2h")
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    url = f"/v1/jobs/{first}/attempts/1/snapshot"
    run_until(sim, first, "RUNNING")
    exported = client.get(url)
    assert exported.status_code == 200, exported.text
    body = exported.json()
    assert body["snapshot"]["code_version"] == "git:abc123"
    assert body["snapshot"]["spec"]["entrypoint"]["image"] == "reg.example/train:latest"
    resolved = body["resolved"]
    assert resolved["image_digest"] == "sha256:" + "a" * 64
    assert resolved["gpu_models"] == ["NVIDIA-H100-80GB-HBM3"]
    assert resolved["nodes"] and resolved["entrypoint_sha256"]
    assert (resolved["code_version"], resolved["data_version"]) == ("git:abc123", "ds:v1")

    # the tag moves on; the running attempt's record does not
    backend.image_id = "docker-pullable://reg.example/train@sha256:" + "b" * 64
    cycle(sim, 5)
    assert client.get(url).content == exported.content

    # resubmitted from the export, with a new code version: a snapshot of its own
    again = body["snapshot"]["spec"] | {"code_version": "git:def456"}
    second = _submit(sim, **again)
    run_until(sim, second, "RUNNING")
    other = client.get(f"/v1/jobs/{second}/attempts/1/snapshot").json()
    assert other["snapshot"]["code_version"] == "git:def456"
    assert other["resolved"]["image_digest"] == "sha256:" + "b" * 64
    assert client.get(url).content == exported.content  # the first is what it was


def test_snapshot_of_an_unknown_attempt_is_a_404(sim: Sim) -> None:
    job = _submit(sim)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    r = client.get(f"/v1/jobs/{job}/attempts/1/snapshot")
    assert r.status_code == 404 and r.json()["type"].endswith("attempt-not-found")
    cycle(sim, 1)  # admitted: the attempt and its snapshot exist, nothing resolved yet
    r = client.get(f"/v1/jobs/{job}/attempts/1/snapshot")
    assert r.status_code == 200 and r.json()["resolved"] is None


def test_cli_snapshot_exports_the_last_attempt_as_json(sim: Sim, monkeypatch: Any) -> None:
    import json

    from typer.testing import CliRunner

    import broker.cli.common as common
    import broker.cli.main as cli
    from broker.client import Client

    job = _submit(sim, code_version="git:abc123")
    run_until(sim, job, "RUNNING")
    http = TestClient(create_app(sim.plane.config, sim.plane.db))

    from tests.harness.inprocess import over_app

    monkeypatch.setattr(common, "Client", lambda url, token=None: over_app(Client(url, token),
                                                                           http))
    out = CliRunner().invoke(cli.app, ["snapshot", job])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert (data["job_id"], data["attempt"]) == (job, 1)
    assert data["snapshot"]["code_version"] == "git:abc123"
    assert data["resolved"]["entrypoint_sha256"]
    out = CliRunner().invoke(cli.app, ["snapshot", job, "--attempt", "7"])
    assert out.exit_code == 1 and "no attempt 7" in out.output
