"""The dashboard's jobs and job pages, served in process (no browser): they call the API's
own service functions (routes_jobs.page, routes_jobs.job_out), whose models they render, so a
route that answers with a serialised body of its own must not be what they call."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.config import IsthmusConfig
from broker.store import Database
from broker.web import build_app
from tests.builders import spec


def test_the_jobs_and_job_pages_show_the_job(db: Database, example_config: IsthmusConfig) -> None:
    client = TestClient(build_app(example_config, db))
    r = client.post("/v1/jobs", json=spec().name("shown-on-the-page").dict())
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    for path in ("/ui/jobs", f"/ui/jobs/{job}", f"/ui/jobs/{job}/logs"):
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[-500:])
        assert "shown-on-the-page" in page.text, path
