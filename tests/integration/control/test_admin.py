"""Admin drain/undrain: a job whose only pool is drained waits with PoolDrained, then runs."""

from __future__ import annotations

import hashlib

import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import parse_config
from tests.builders import spec
from tests.harness import audit
from tests.harness.sim import CONFIG, Sim, cycle, state, submit


def test_drain_holds_jobs_with_pool_drained_until_undrain(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    r = client.post("/v1/admin/pools/slurm-h100/drain", json={"reason": "firmware update"})
    assert r.status_code == 200 and r.json()["drained"] is True
    job = submit(sim, spec().flavors("h100-80g"), 30)
    cycle(sim, 5)
    assert state(sim, job) == ("QUEUED", "PoolDrained")
    explained = client.get(f"/v1/jobs/{job}/explain").json()["explanation"]
    assert explained["pools"][0]["reason"] == "PoolDrained"
    pools = {p["name"]: p for p in client.get("/v1/admin/pools").json()}
    assert pools["slurm-h100"]["reason"] == "firmware update"
    assert pools["k8s-a100"]["drained"] is False
    assert client.post("/v1/admin/pools/slurm-h100/undrain").json()["drained"] is False
    for _ in range(10):
        cycle(sim, 10)
    assert state(sim, job)[0] == "SUCCEEDED"
    assert client.post("/v1/admin/pools/nope/drain", json={}).status_code == 404
    assert [line for line in audit.lines(sim.plane.db) if line[0] != "read"] == [
        ("pool.drain", "pool:slurm-h100", "local", 200),
        ("pool.undrain", "pool:slurm-h100", "local", 200),
        ("pool.drain", "pool:nope", "local", 404)]
    assert ("read", "all-teams", "local", 200) in audit.lines(sim.plane.db)  # /v1/admin/pools


def test_admin_routes_need_an_admin(sim: Sim) -> None:
    data = yaml.safe_load(yaml.safe_dump(CONFIG))
    data["auth"] = {"mode": "token", "tokens": [
        {"name": "u", "team": "vision", "role": "user",
         "token_sha256": hashlib.sha256(b"user").hexdigest()},
    ]}
    client = TestClient(create_app(parse_config(data), sim.plane.db))
    r = client.post("/v1/admin/pools/slurm-h100/drain", json={},
                    headers={"Authorization": "Bearer user"})
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    assert client.get("/v1/admin/usage").status_code == 401
    assert audit.lines(sim.plane.db) == [("pool.drain", "pool:slurm-h100", "u", 403),
                                         ("read", "all-teams", "(unauthenticated)", 401)]
