"""The progress endpoint refuses steps and checkpoints that the database could not store, with
a 422 naming the field, instead of a 500 from the INTEGER column (2^31 on PostgreSQL)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.orchestration.submission import submit_job
from broker.store.secrets import progress_token, server_secret
from tests.builders import spec
from tests.harness.sim import Sim


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"step": 2**31}, "step"),
        ({"step": 2**63}, "step"),
        ({"step": 2**70}, "step"),
        ({"step": True}, "step"),
        ({"step": "12"}, "step"),
        ({"step": 1, "checkpoint": "/ckpt/\x00"}, "checkpoint"),
    ],
    ids=["2^31", "2^63", "2^70", "bool", "string", "nul-checkpoint"],
)
def test_out_of_range_progress_is_a_422(sim: Sim, body: dict[str, object], field: str) -> None:
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 1
    token = progress_token(server_secret(sim.plane.db, "progress"), job.id, 1)
    client = TestClient(create_app(sim.plane.config, sim.plane.db), raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {token}"}
    r = client.post(f"/v1/jobs/{job.id}/progress", json=body, headers=auth)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == field
    top = client.post(f"/v1/jobs/{job.id}/progress", json={"step": 2**31 - 1}, headers=auth)
    assert top.status_code == 200, top.text


@pytest.mark.parametrize("body", [{"step": 2**70}, {"nonsense": 1}, "not json"])
def test_an_unauthenticated_report_is_a_401_whatever_its_body(sim: Sim, body: object) -> None:
    """Authentication comes before the body is read: no token, a 401, never a 422 telling the
    caller what a body must be."""
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    client = TestClient(create_app(sim.plane.config, sim.plane.db), raise_server_exceptions=False)
    r = client.post(f"/v1/jobs/{job.id}/progress", json=body)
    assert r.status_code == 401, r.text
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
