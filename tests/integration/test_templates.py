"""Job templates (isthmus.yaml `templates`): a user submits a vetted preset with a name, a team
and the overrides it allows; anything else is refused naming the field; a template offered to
some teams is invisible to the others; the configuration refuses a broken preset up front."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import ConfigError, parse_config
from broker.config_templates import TEMPLATE_ANNOTATION
from broker.store import Database
from tests.builders import spec
from tests.harness.paths import EXAMPLE_CONFIG

ALICE, BOB = "alice-secret", "bob-secret"
PRESET = {k: v for k, v in spec().dict().items() if k not in ("name", "team")}


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _config(templates: list[dict[str, Any]]) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {"mode": "token", "tokens": [
        {"name": "alice", "team": "vision", "role": "user", "token_sha256": _sha(ALICE)},
        {"name": "bob", "team": "language", "role": "user", "token_sha256": _sha(BOB)},
    ]}
    data["templates"] = templates
    return data


@pytest.fixture
def client(db: Database) -> Iterator[TestClient]:
    cfg = parse_config(_config([
        {"name": "llama-ft", "description": "fine-tune on 2x8 H100", "spec": PRESET,
         "allow": ["gang.replicas", "env", "max_runtime"]},
        {"name": "vision-only", "teams": ["vision"], "spec": PRESET},
    ]))
    with TestClient(create_app(cfg, db)) as c:
        yield c


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_job_from_a_template_takes_the_preset_and_the_allowed_overrides(
        client: TestClient) -> None:
    r = client.post("/v1/templates/llama-ft/jobs", headers=_as(ALICE), json={
        "name": "my-run", "set": {"gang.replicas": 4, "env.LR": "3e-4", "max_runtime": "1h"}})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["name"], job["team"], job["state"]) == ("my-run", "vision", "QUEUED")
    got = client.get(f"/v1/jobs/{job['id']}", headers=_as(ALICE)).json()["spec"]
    assert (got["gang"]["replicas"], got["gang"]["gpus_per_replica"]) == (
        4, PRESET["gang"]["gpus_per_replica"])
    assert got["env"]["LR"] == "3e-4" and got["max_runtime"] == "1h"
    assert got["flavors"] == PRESET["flavors"]  # what the user did not touch is the preset's
    assert got["annotations"][TEMPLATE_ANNOTATION] == "llama-ft"


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"flavors": ["a100-80g"]}, "set.flavors", "does not let users change flavors"),
    ({"priority": "high"}, "set.priority", "allowed: env, gang.replicas, max_runtime"),
    ({"gang.gpus_per_replica": 1}, "set.gang.gpus_per_replica", "does not let users"),
    ({"gang.replicas": 0}, "gang.replicas", ""),
], ids=["flavors", "priority", "sibling-field", "bad-value"])
def test_an_override_outside_the_template_is_refused_naming_it(
        client: TestClient, overrides: dict[str, Any], field: str, words: str) -> None:
    r = client.post("/v1/templates/llama-ft/jobs", headers=_as(ALICE),
                    json={"name": "x", "set": overrides})
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()
    assert words in r.json()["detail"]
    assert client.get("/v1/jobs", headers=_as(ALICE)).json()["items"] == []


def test_a_template_for_some_teams_is_invisible_to_the_others(client: TestClient) -> None:
    assert [t["name"] for t in client.get("/v1/templates", headers=_as(BOB)).json()] == [
        "llama-ft"]
    assert [t["name"] for t in client.get("/v1/templates", headers=_as(ALICE)).json()] == [
        "llama-ft", "vision-only"]
    r = client.post("/v1/templates/vision-only/jobs", headers=_as(BOB), json={"name": "x"})
    assert r.status_code == 404, r.text
    r = client.post("/v1/templates/llama-ft/jobs", headers=_as(BOB),
                    json={"name": "x", "team": "vision"})
    assert r.status_code == 403, r.text  # another team's job, as POST /v1/jobs answers
    assert client.post("/v1/templates/nope/jobs", headers=_as(ALICE),
                       json={"name": "x"}).status_code == 404


@pytest.mark.parametrize(("template", "words"), [
    ({"name": "t", "spec": {**PRESET, "gang": {"replicas": 0, "gpus_per_replica": 8}}},
     "templates[0].spec.gang.replicas"),
    ({"name": "t", "teams": ["physics"], "spec": PRESET}, "templates[0].teams: ['physics']"),
    ({"name": "t", "spec": {**PRESET, "team": "vision"}}, "given by the user on every use"),
    ({"name": "t", "spec": PRESET, "allow": ["gang replicas"]}, "allow[0]"),
], ids=["broken-spec", "unknown-team", "team-in-spec", "bad-path"])
def test_the_configuration_refuses_a_broken_template_naming_the_field(
        template: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_config([template]))
    assert words in str(err.value)


def test_the_cli_takes_a_file_or_a_template_and_reads_set_values_as_json() -> None:
    from typer.testing import CliRunner

    from broker.cli.main import app
    from broker.config_templates import TemplateError, parse_override

    assert parse_override("gang.replicas=4") == ("gang.replicas", 4)
    assert parse_override("max_runtime=3600") == ("max_runtime", 3600)
    assert parse_override("env.LR=3e-4") == ("env.LR", "3e-4")  # a variable keeps its text
    assert parse_override("env.NAME=run 7") == ("env.NAME", "run 7")
    with pytest.raises(TemplateError):
        parse_override("replicas")
    runner = CliRunner()
    both = runner.invoke(app, ["submit", "-f", "x.yaml", "--template", "t", "--name", "n"])
    assert both.exit_code != 0 and "one of the two" in both.output
    nameless = runner.invoke(app, ["submit", "--template", "t"])
    assert nameless.exit_code != 0 and "--name" in nameless.output
