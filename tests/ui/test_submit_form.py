"""The dashboard's submit form without a browser: a team member picks a template, names the job
and changes what the template allows; the job is POST /v1/templates/{name}/jobs's (same
checks, same refusals naming the field); a double submit is one job; another site's post is
refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.config import load_config
from broker.config_templates import TEMPLATE_ANNOTATION
from broker.store import open_database
from broker.ui.session import COOKIE
from broker.web import build_app
from tests.harness.ui import TOKENS, ui_config

HERE = {"Origin": "http://testserver"}


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[TestClient]:
    db = open_database(f"sqlite:///{tmp_path / 'ui.db'}")
    try:
        app = build_app(load_config(ui_config(tmp_path / "isthmus.yaml")), db)
        with TestClient(app, follow_redirects=False) as c:
            c.cookies.set(COOKIE, TOKENS["alice"], path="/ui")
            yield c
    finally:
        db.dispose()


def _key(html: str) -> str:
    m = re.search(r'name="key" value="([^"]+)"', html)
    assert m is not None
    return m.group(1)


def _jobs(c: TestClient) -> list[dict[str, object]]:
    items: list[dict[str, object]] = c.get(
        "/v1/jobs", headers={"Authorization": f"Bearer {TOKENS['alice']}"}).json()["items"]
    return items


def test_a_job_from_the_form_is_the_templates_with_the_allowed_changes(
        alice: TestClient) -> None:
    chooser = alice.get("/ui/submit")
    assert chooser.status_code == 200 and 'value="bert-ft"' in chooser.text
    form = alice.get("/ui/submit?template=bert-ft")
    assert form.status_code == 200
    for path in ("gang.replicas", "env", "max_runtime"):  # one field each, as the template says
        assert f'name="set.{path}"' in form.text
    r = alice.post("/ui/submit/bert-ft", headers=HERE, data={
        "key": _key(form.text), "name": "from-form", "team": "vision",
        "set.gang.replicas": "2", "set.max_runtime": "1h", "set.env": "{}",
        "extra": "env.LR=3e-4\n"})
    assert r.status_code == 303, r.text
    job_id = r.headers["location"].removeprefix("/ui/jobs/")
    (job,) = _jobs(alice)
    assert job["id"] == job_id and job["team"] == "vision" and job["name"] == "from-form"
    spec = alice.get(f"/v1/jobs/{job_id}",
                     headers={"Authorization": f"Bearer {TOKENS['alice']}"}).json()["spec"]
    assert spec["gang"]["replicas"] == 2 and spec["env"] == {"LR": "3e-4"}
    assert spec["annotations"][TEMPLATE_ANNOTATION] == "bert-ft"
    assert alice.get(r.headers["location"]).status_code == 200  # the job's page
    # the form's submit is in the audit log as the API's would be
    log = alice.get("/v1/admin/audit?action=job.submit-template",
                    headers={"Authorization": f"Bearer {TOKENS['root']}"})
    assert log.status_code == 200, log.text
    assert [(i["actor"], i["route"], i["target"], i["outcome"]) for i in log.json()["items"]] \
        == [("alice", "/ui/submit/{name}", f"job:{job_id}", "allowed")], log.text


def test_a_refusal_shows_the_form_again_naming_the_field(alice: TestClient) -> None:
    form = alice.get("/ui/submit?template=bert-ft")
    r = alice.post("/ui/submit/bert-ft", headers=HERE, data={
        "key": _key(form.text), "name": "nope", "extra": "flavors=[\"h100-80g\"]"})
    assert r.status_code == 422
    assert "set.flavors" in r.text and "does not let users change flavors" in r.text
    assert 'value="nope"' in r.text  # what was typed is kept
    r = alice.post("/ui/submit/bert-ft", headers=HERE, data={
        "key": _key(form.text), "name": "big", "set.gang.replicas": "100000"})
    assert r.status_code == 422 and "gang.replicas" in r.text
    assert _jobs(alice) == []


def test_a_double_submit_is_one_job_and_another_sites_post_none(alice: TestClient) -> None:
    form = alice.get("/ui/submit?template=bert-ft")
    data = {"key": _key(form.text), "name": "once"}
    first = alice.post("/ui/submit/bert-ft", headers=HERE, data=data)
    again = alice.post("/ui/submit/bert-ft", headers=HERE, data=data)
    assert first.status_code == again.status_code == 303
    assert first.headers["location"] == again.headers["location"]
    evil = alice.post("/ui/submit/bert-ft", headers={"Origin": "https://evil.example"},
                      data={"key": "k2", "name": "evil"})
    assert evil.status_code == 403
    assert [j["name"] for j in _jobs(alice)] == ["once"]
    other_team = alice.post("/ui/submit/bert-ft", headers=HERE,
                            data={"key": "k3", "name": "x", "team": "language"})
    assert other_team.status_code == 403 and "belongs to team &#39;vision&#39;" in other_team.text
