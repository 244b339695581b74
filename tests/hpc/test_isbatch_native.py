"""isbatch and the native options escape hatch (issue 33), through the API in this process: an
#SBATCH option Isthmus does not translate reaches Slurm when the job's team's policy allows it
(the batch call decides: isbatch sends the script, not a verdict), and is refused otherwise,
naming the option and the configuration key that would allow it."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backends.base import SubmitRequest
from backends.slurm.script import RenderSettings, batch_job
from backends.slurm.transport_rest import RestTransport
from broker.api.app import create_app
from broker.client import Client
from broker.config import parse_config
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec
from broker.dropins import isbatch
from broker.store.db import Database
from tests.harness.inprocess import over_app
from tests.harness.sim import CONFIG

SCRIPT = """#!/bin/bash
#SBATCH -J train
#SBATCH --gres=gpu:h100:8
#SBATCH -t 30
#SBATCH --reservation=maint-window
#SBATCH -q urgent
srun python train.py
"""


def _token(name: str, team: str) -> dict[str, object]:
    return {"name": name, "team": team, "role": "user",
            "token_sha256": hashlib.sha256(name.encode()).hexdigest()}


@pytest.fixture
def app_client(db: Database) -> Iterator[TestClient]:
    raw = copy.deepcopy(CONFIG)
    raw["auth"] = {"mode": "token", "tokens": [_token("vera", "vision"),
                                               _token("leo", "language")]}
    raw["teams"][0]["native"] = {"slurm": {"options": ["--reservation", "--qos"]}}
    raw["slurm_compat"] = {
        "default_partition": "gpu",
        "partitions": {"gpu": {"flavors": ["h100-80g", "a100-80g"], "backend": "any"}},
        "qos": {"urgent": "high"},
        "gpu_types": {"h100": "h100-80g", "a100": "a100-80g"},
    }
    with TestClient(create_app(parse_config(raw), db)) as client:
        yield client


@pytest.fixture
def run_isbatch(app_client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                ) -> Callable[..., int]:
    """isbatch as a user types it, its one API call answered by the app in this process."""
    monkeypatch.setattr(isbatch, "Client", lambda url, token=None: over_app(
        Client(url, token), app_client))
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)

    def run(user: str, *args: str) -> int:
        env = {"ISTHMUS_URL": "http://isthmus.invalid", "ISTHMUS_TOKEN": user,
               "HOME": str(tmp_path)}
        return isbatch.run([*args, "--json", str(script)], env)

    return run


def _stored_spec(app_client: TestClient, out: str) -> dict[str, Any]:
    import json

    job_id = json.loads(out)["id"]
    r = app_client.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer vera"})
    assert r.status_code == 200, r.text
    return dict(r.json()["spec"])


def _slurm_submission(spec: dict[str, Any]) -> SubmitRequest:
    """The request the dispatcher would hand the Slurm backend for this job's first attempt."""
    placement = Placement(backend="slurm", backend_instance="sim-slurm", pool="slurm-h100",
                          flavor="h100-80g")
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name="isthmus-01abcdefghjkmnpq-1",
                         snapshot=RunSnapshot.of(JobSpec.model_validate(spec)),
                         placement=placement, env={})


def test_an_allowed_option_reaches_the_slurm_script_and_the_rest_body(
        run_isbatch: Callable[..., int], app_client: TestClient,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_isbatch("vera") == 0
    spec = _stored_spec(app_client, capsys.readouterr().out)
    assert spec["native"]["slurm"] == {"options": ["--reservation=maint-window"]}
    assert spec["backend"] == "slurm"  # sbatch reads it: Kubernetes pools are left out
    # -q is translated as before (a priority class), though the policy allows --qos too
    assert spec["priority"] == "high"
    job = batch_job(_slurm_submission(spec), RenderSettings(), partition="h100")
    directives = [line for line in job.script.splitlines() if line.startswith("#SBATCH ")]
    assert "#SBATCH --reservation=maint-window" in directives
    assert not any(d.startswith("#SBATCH --qos") for d in directives)
    rest = RestTransport(url="http://slurmrestd.invalid", user="u", token="t",
                         version="v0.0.38")
    assert rest.submit_body(job)["job"]["reservation"] == "maint-window"


def test_a_team_without_the_option_in_its_policy_is_refused_naming_it_and_the_key(
        run_isbatch: Callable[..., int], app_client: TestClient,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run_isbatch("leo") == 1
    err = capsys.readouterr().err
    assert err.startswith("isbatch: error: --reservation: not supported by Isthmus, and team "
                          "language may not pass it to Slurm natively (nothing was submitted); "
                          "an admin may allow it in isthmus.yaml teams[].native.slurm.options "
                          "(allowed now: nothing)"), err
    r = app_client.get("/v1/jobs", headers={"Authorization": "Bearer leo"})
    assert r.json()["items"] == []


def test_test_only_maps_as_the_batch_call_does(
        run_isbatch: Callable[..., int], capsys: pytest.CaptureFixture[str]) -> None:
    """--test-only maps on the login node with the policy the broker serves for the caller's
    team: the plan's spec carries the option, and another team's test is refused alike."""
    import json

    assert run_isbatch("vera", "--test-only") == 0
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert spec["native"] == {"slurm": {"options": ["--reservation=maint-window"]}}
    assert run_isbatch("leo", "--test-only") == 1
    assert "team language may not pass it" in capsys.readouterr().err
