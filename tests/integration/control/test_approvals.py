"""Approval of priority classes (issue 33): a job of a class with `approval: required` waits
QUEUED with AwaitingApproval until an admin approves it (it then runs) or refuses it (it ends
CANCELLED with ApprovalRefused and the admin's reason); the decision is one job event naming
who decided, and a job is decided once."""

from __future__ import annotations

import copy
import hashlib

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.ui.session import COOKIE
from broker.web import build_app
from tests.builders import spec
from tests.harness import audit
from tests.harness.sim import CONFIG, Sim, consistent, cycle, run_until, state, submit


def _config(auth: dict[str, object] | None = None) -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    raw["priority_classes"] = [
        {"name": "low", "value": 0}, {"name": "normal", "value": 100},
        {"name": "urgent", "value": 1000, "approval": "required"},
    ]
    if auth is not None:
        raw["auth"] = auth
    return parse_config(raw)


def _token(name: str, role: str, secret: bytes) -> dict[str, object]:
    return {"name": name, "team": "vision", "role": role,
            "token_sha256": hashlib.sha256(secret).hexdigest()}


TOKENS: dict[str, object] = {"mode": "token", "tokens": [_token("ada", "admin", b"admin"),
                                                    _token("bob", "user", b"user")]}
ADMIN = {"Authorization": "Bearer admin"}
DECISIONS = ("job.approve", "job.refuse")
USER = {"Authorization": "Bearer user"}


def _urgent(sim: Sim) -> str:
    return submit(sim, spec().name("urgent-eval").flavors("h100-80g").replicas(1).gpus(8)
                  .topology(None).set("priority", "urgent"), 60)


@pytest.mark.parametrize("sim_config", [_config(TOKENS)], indirect=False)
def test_an_approval_required_job_waits_then_runs_once_approved(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    job = _urgent(sim)
    plain = submit(sim, spec().name("plain").flavors("h100-80g").replicas(1).gpus(8)
                   .topology(None), 60)
    for _ in range(3):
        cycle(sim, 10)
    assert state(sim, job) == ("QUEUED", "AwaitingApproval")
    assert state(sim, plain)[0] in ("RUNNING", "SUCCEEDED")  # the others are not held back
    explained = client.get(f"/v1/jobs/{job}/explain", headers=USER).json()
    assert explained["reason"] == "AwaitingApproval"
    assert "'urgent' needs an admin's approval" in explained["message"]
    pending = client.get("/v1/admin/approvals", headers=ADMIN).json()
    assert [j["id"] for j in pending] == [job]

    r = client.post(f"/v1/admin/jobs/{job}/approve", json={}, headers=USER)
    assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    assert client.post(f"/v1/admin/jobs/{job}/approve").status_code == 401
    assert state(sim, job) == ("QUEUED", "AwaitingApproval")

    r = client.post(f"/v1/admin/jobs/{job}/approve", json={"note": "eval deadline"},
                    headers=ADMIN)
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["reason"]) == ("QUEUED", "Approved")
    events = client.get(f"/v1/jobs/{job}/events", headers=USER).json()
    decision = [e for e in events if e["reason"] == "Approved"]
    assert len(decision) == 1 and decision[0]["actor"] == "ada" and decision[0]["at"]
    assert "eval deadline" in decision[0]["message"]
    run_until(sim, job, "RUNNING", step=10)
    again = client.post(f"/v1/admin/jobs/{job}/refuse", json={"reason": "x"}, headers=ADMIN)
    assert again.status_code == 409 and "already approved by ada" in again.json()["detail"]
    assert client.get("/v1/admin/approvals", headers=ADMIN).json() == []
    run_until(sim, job, "SUCCEEDED", step=10)
    consistent(sim)
    decided = [line for line in audit.lines(sim.plane.db) if line[0] in DECISIONS]
    assert decided == [("job.approve", f"job:{job}", "bob", 403),
                       ("job.approve", f"job:{job}", "(unauthenticated)", 401),
                       ("job.approve", f"job:{job}", "ada", 200),
                       ("job.refuse", f"job:{job}", "ada", 409)]
    assert audit.intact(sim.plane.db)


@pytest.mark.parametrize("sim_config", [_config(TOKENS)], indirect=False)
def test_a_refused_job_ends_cancelled_with_the_reason(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    job = _urgent(sim)
    cycle(sim, 10)
    assert state(sim, job) == ("QUEUED", "AwaitingApproval")
    missing = client.post(f"/v1/admin/jobs/{job}/refuse", json={}, headers=ADMIN)
    assert missing.status_code == 422  # a refusal needs its reason
    r = client.post(f"/v1/admin/jobs/{job}/refuse",
                    json={"reason": "not a deadline; use normal"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["state"], body["reason"]) == ("CANCELLED", "ApprovalRefused")
    assert "refused by ada: not a deadline; use normal" in body["message"]
    last = client.get(f"/v1/jobs/{job}/events", headers=USER).json()[-1]
    assert (last["to_state"], last["actor"]) == ("CANCELLED", "ada")
    for _ in range(3):
        cycle(sim, 10)
    assert state(sim, job) == ("CANCELLED", "ApprovalRefused")
    assert client.post(f"/v1/admin/jobs/{job}/approve", headers=ADMIN).status_code == 409
    consistent(sim)
    decided = [line for line in audit.lines(sim.plane.db) if line[0] in DECISIONS]
    assert decided == [("job.refuse", f"job:{job}", "ada", 422),
                       ("job.refuse", f"job:{job}", "ada", 200),
                       ("job.approve", f"job:{job}", "ada", 409)]


@pytest.mark.parametrize("sim_config", [_config()], indirect=False)
def test_only_waiting_jobs_of_an_approval_class_can_be_decided(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    plain = submit(sim, spec().flavors("h100-80g").replicas(1).gpus(8).topology(None), 60)
    r = client.post(f"/v1/admin/jobs/{plain}/approve")
    assert r.status_code == 409 and "needs no approval" in r.json()["detail"]
    assert client.post("/v1/admin/jobs/01ARZ3NDEKTSV4RRFFQ69G5FAV/approve").status_code == 404
    assert client.post("/v1/admin/jobs/nope/refuse", json={"reason": "x"}).status_code == 404
    openapi = client.get("/openapi.json").json()["paths"]
    for action in ("approve", "refuse"):
        documented = openapi[f"/v1/admin/jobs/{{job_id}}/{action}"]["post"]["responses"]
        assert {"401", "403", "404", "409"} <= set(documented)


@pytest.mark.parametrize("sim_config", [_config(TOKENS)], indirect=False)
def test_the_dashboard_lists_pending_approvals_to_admins(sim: Sim) -> None:
    job = _urgent(sim)
    cycle(sim, 10)
    app = build_app(sim.plane.config, sim.plane.db)
    admin = TestClient(app, cookies={COOKIE: "admin"}).get("/ui/approvals")
    assert admin.status_code == 200 and f'href="/ui/jobs/{job}"' in admin.text
    assert "isthmus admin approve ID" in admin.text
    user = TestClient(app, cookies={COOKIE: "user"}).get("/ui/approvals")
    assert user.status_code == 403 and 'id="approvals-admin-only"' in user.text
    assert job not in user.text
