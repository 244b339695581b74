"""The guarded escape hatch through the API (issue 33): a team whose policy allows them passes a
pod template overlay and extra sbatch options; the job shows them as given (GET, explain, the
CLI's show) and its attempt's snapshot binds them; another team, or a field outside the
team's lists, is refused with a 422 naming the field and the fix, and nothing is stored."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import broker.cli.common as common
import broker.cli.main as cli
from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from tests.builders import spec
from tests.harness.inprocess import route_clients
from tests.harness.sim import CONFIG, Sim, cycle, run_until


def _token(name: str, team: str) -> dict[str, object]:
    return {"name": name, "team": team, "role": "user",
            "token_sha256": hashlib.sha256(name.encode()).hexdigest()}


def _config() -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    raw["auth"] = {"mode": "token", "tokens": [_token("vera", "vision"),
                                               _token("leo", "language")]}
    raw["teams"][0]["native"] = {
        "k8s": {"pod_template": ["spec.tolerations", "metadata.labels"]},
        "slurm": {"options": ["--qos", "--constraint"]},
    }
    return parse_config(raw)


VISION = {"Authorization": "Bearer vera"}
LANGUAGE = {"Authorization": "Bearer leo"}
NATIVE = {
    "k8s": {"pod_template": {
        "metadata": {"labels": {"example.com/cost-centre": "cv-42"}},
        "spec": {"tolerations": [{"key": "example.com/spot", "operator": "Exists"}]}}},
    "slurm": {"options": ["--qos=high", "--constraint=ib"]},
}


def _spec(team: str, native: dict[str, Any]) -> dict[str, Any]:
    data = spec().name("hatch").team(team).flavors("h100-80g").replicas(1).gpus(8) \
        .topology(None).dict()
    return data | {"native": native, "env": {"ISTHMUS_SIM_DURATION": "30"}}


@pytest.mark.parametrize("sim_config", [_config()], indirect=False)
def test_an_allowed_team_passes_native_options_shown_and_bound_as_given(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(sim.plane.config, sim.plane.db)
    client = TestClient(app)
    route_clients(monkeypatch, common, app)
    r = client.post("/v1/jobs", headers=VISION, json=_spec("vision", NATIVE))
    assert r.status_code == 201, r.text
    job = r.json()
    assert client.get(f"/v1/jobs/{job['id']}", headers=VISION).json()["spec"]["native"] == NATIVE
    explained = client.get(f"/v1/jobs/{job['id']}/explain", headers=VISION).json()
    assert explained["native"] == NATIVE
    for command in ("status", "explain"):
        out = CliRunner().invoke(cli.app, [command, job["id"], "--token", "vera"],
                                 env={"COLUMNS": "400"})
        assert out.exit_code == 0, out.output
        assert "--qos=high --constraint=ib" in out.output, (command, out.output)
        assert '"example.com/cost-centre":"cv-42"' in out.output, (command, out.output)
    cycle(sim)
    run_until(sim, job["id"], "RUNNING")
    (attempt,) = client.get(f"/v1/jobs/{job['id']}/attempts", headers=VISION).json()
    assert attempt["snapshot"]["spec"]["native"] == NATIVE


@pytest.mark.parametrize("sim_config", [_config()], indirect=False)
@pytest.mark.parametrize(("headers", "team", "native", "field", "words"), [
    (LANGUAGE, "language", {"slurm": {"options": ["--qos=high"]}}, "native.slurm.options[0]",
     "team language may not pass --qos"),
    (LANGUAGE, "language", NATIVE, "native.k8s.pod_template.spec.tolerations",
     "allows: nothing"),
    (VISION, "vision", {"slurm": {"options": ["--qos=high", "--reservation=r1"]}},
     "native.slurm.options[1]", "may not pass --reservation"),
    (VISION, "vision", {"k8s": {"pod_template": {"spec": {"priorityClassName": "top"}}}},
     "native.k8s.pod_template.spec.priorityClassName", "may not set spec.priorityClassName"),
    (VISION, "vision", {"k8s": {"pod_template": {"spec": {"nodeSelector": {"a": "b"}}}}},
     "native.k8s.pod_template", "spec.nodeSelector: Isthmus sets it"),
    (VISION, "vision", {"slurm": {"options": ["--partition=debug"]}},
     "native.slurm.options", "--partition: Isthmus sets it"),
], ids=["team-without-policy", "team-without-policy-k8s", "option-outside", "field-outside",
        "enforced-field", "enforced-option"])
def test_outside_the_teams_policy_is_refused_naming_the_field(
        sim: Sim, headers: dict[str, str], team: str, native: dict[str, Any], field: str,
        words: str) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    r = client.post("/v1/jobs", headers=headers, json=_spec(team, native))
    assert r.status_code == 422, r.text
    body = r.json()
    assert field in [e["field"] for e in body["errors"]], body
    assert words in body["detail"], body
    assert client.get("/v1/jobs", headers=headers).json()["items"] == []
