"""The v1 API on both databases: lifecycle, bad input, idempotency, auth and team scoping."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.store import Database
from tests.builders import spec
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.wait import wait_until

PROBLEM = "application/problem+json"


@pytest.fixture
def client(db: Database, example_config: IsthmusConfig) -> Iterator[TestClient]:
    with TestClient(create_app(example_config, db)) as c:
        yield c


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


def test_submit_goes_to_queued_with_events(client: TestClient) -> None:
    r = client.post("/v1/jobs", json=spec().dict())
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["state"], job["reason"]) == ("QUEUED", "WaitingForAdmission")
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"
    events = client.get(f"/v1/jobs/{job['id']}/events").json()
    assert [(e["seq"], e["from_state"], e["to_state"]) for e in events] == [
        (1, None, "SUBMITTED"), (2, "SUBMITTED", "VALIDATING"), (3, "VALIDATING", "QUEUED"),
    ]
    assert set(events[0]) >= {"seq", "at", "from_state", "to_state", "reason", "message", "actor"}


def test_infeasible_spec_is_stored_and_rejected_with_the_limit(client: TestClient) -> None:
    r = client.post("/v1/jobs", json=spec().replicas(6).flavors("h100-80g").dict())
    assert r.status_code == 201
    job = r.json()
    assert (job["state"], job["reason"]) == ("REJECTED", "ExceedsCapacity")
    assert "short by 2 replicas (16 GPUs)" in job["message"]
    events = client.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["to_state"] for e in events] == ["SUBMITTED", "VALIDATING", "REJECTED"]


BAD_INPUT: list[tuple[str, Any, str | None, int, str]] = [
    ("malformed-json", b'{"name": "x",', "application/json", 400, "(body)"),
    ("unknown-field", {**spec().dict(), "gpus": 8}, None, 422, "gpus"),
    ("zero-gpus", spec().gpus(0).dict(), None, 422, "gang.gpus_per_replica"),
    ("negative-gpus", spec().gpus(-1).dict(), None, 422, "gang.gpus_per_replica"),
    ("replicas-cap", spec().replicas(257).gpus(1).dict(), None, 422, "gang.replicas"),
    ("unknown-team", spec().team("robotics").dict(), None, 422, "team"),
    ("unknown-flavor", spec().flavors("b200").dict(), None, 422, "flavors[0]"),
    ("missing-gang", {k: v for k, v in spec().dict().items() if k != "gang"}, None, 422, "gang"),
    ("not-an-object", b"[1, 2]", "application/json", 422, "(body)"),
    ("wrong-type", {**spec().dict(), "gang": {"replicas": "two", "gpus_per_replica": 8}}, None,
     422, "gang.replicas"),
    ("text-plain", b"{}", "text/plain", 415, "Content-Type"),
    ("yaml", b"name: x", "application/yaml", 415, "Content-Type"),
    ("oversized", b"{" + b" " * 300_000 + b"}", "application/json", 413, "(body)"),
]


@pytest.mark.parametrize(
    ("body", "ctype", "status", "field"), [b[1:] for b in BAD_INPUT], ids=[b[0] for b in BAD_INPUT]
)
def test_bad_input_gets_a_problem_naming_the_field_and_stores_nothing(
    client: TestClient, body: Any, ctype: str | None, status: int, field: str
) -> None:
    if isinstance(body, bytes):
        r = client.post("/v1/jobs", content=body, headers={"content-type": ctype or ""})
    else:
        r = client.post("/v1/jobs", json=body)
    problem = _problem(r, status)
    fields = [e["field"] for e in problem.get("errors", [])]
    assert field in fields, problem
    assert client.get("/v1/jobs").json()["items"] == []


def test_chunked_oversized_body_is_refused(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 10_000

    r = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    _problem(r, 413)


def test_unknown_ids_and_bad_queries(client: TestClient) -> None:
    _problem(client.get("/v1/jobs/0000000000000000"), 404)
    _problem(client.get("/v1/jobs/not-an-id/events"), 404)
    _problem(client.post("/v1/jobs/0000000000000000/cancel"), 404)
    assert _problem(client.get("/v1/jobs?limit=0"), 422)["errors"][0]["field"] == "limit"
    assert _problem(client.get("/v1/jobs?state=PENDING"), 422)["errors"][0]["field"].startswith(
        "state"
    )
    assert _problem(client.get("/v1/jobs?cursor=zzz"), 422)["errors"][0]["field"] == "cursor"
    _problem(client.get("/v1/nothing"), 404)


def test_cancel(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=spec().dict()).json()
    r = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200  # idempotent
    rejected = client.post("/v1/jobs", json=spec().replicas(6).dict()).json()
    assert "REJECTED" in _problem(client.post(f"/v1/jobs/{rejected['id']}/cancel"), 409)["detail"]


def test_pagination_and_filters(client: TestClient) -> None:
    ids = [client.post("/v1/jobs", json=spec().name(f"j{i}").dict()).json()["id"]
           for i in range(7)]
    client.post(f"/v1/jobs/{ids[0]}/cancel")
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    queued = client.get("/v1/jobs", params={"state": "QUEUED"}).json()["items"]
    assert len(queued) == 6
    both = client.get("/v1/jobs", params={"state": ["QUEUED", "CANCELLED"]}).json()["items"]
    assert len(both) == 7
    assert client.get("/v1/jobs", params={"team": "language"}).json()["items"] == []


def test_idempotency_key(client: TestClient) -> None:
    body = spec().dict()
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "abc"})
    again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "abc"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = client.post(
        "/v1/jobs", json=spec().replicas(1).dict(), headers={"Idempotency-Key": "abc"}
    )
    assert _problem(other, 409)["errors"][0]["field"] == "Idempotency-Key"
    assert len(client.get("/v1/jobs").json()["items"]) == 1


@pytest.fixture
def live_url(db: Database, example_config: IsthmusConfig) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(example_config, db), host="127.0.0.1", port=0, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 60, "the server to start",
               interval=0.05)
    assert server.started, "the server thread ended before it started"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.slow
def test_idempotency_under_concurrent_requests(live_url: str) -> None:
    body = spec().dict()

    def post(i: int) -> tuple[int, str]:
        key = f"key-{i % 4}"
        r = httpx.post(f"{live_url}/v1/jobs", json=body, headers={"Idempotency-Key": key},
                       timeout=30)
        return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(post, range(64)))
    assert {status for status, _ in results} <= {200, 201}
    assert sum(1 for status, _ in results if status == 201) == 4
    by_key: dict[int, set[str]] = {}
    for i, (_, job_id) in enumerate(results):
        by_key.setdefault(i % 4, set()).add(job_id)
    assert all(len(ids) == 1 for ids in by_key.values())
    listed = httpx.get(f"{live_url}/v1/jobs", params={"limit": 500}).json()["items"]
    assert len(listed) == 4


ALICE, BOB, ROOT = "alice-secret", "bob-secret", "root-secret"


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


@pytest.fixture
def secured(db: Database) -> Iterator[TestClient]:
    import yaml

    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {
        "mode": "token",
        "tokens": [
            {"name": "alice", "team": "vision", "role": "user", "token_sha256": _sha(ALICE)},
            {"name": "bob", "team": "language", "role": "user", "token_sha256": _sha(BOB)},
            {"name": "root", "role": "admin", "token_sha256": _sha(ROOT)},
        ],
    }
    with TestClient(create_app(parse_config(data), db)) as c:
        yield c


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_auth_and_team_scoping(secured: TestClient) -> None:
    c = secured
    assert c.get("/healthz").status_code == 200
    _problem(c.get("/v1/jobs"), 401)
    _problem(c.get("/v1/jobs", headers=_as("wrong")), 401)
    _problem(c.post("/v1/jobs", json=spec().dict()), 401)
    vision = c.post("/v1/jobs", json=spec().dict(), headers=_as(ALICE)).json()
    assert vision["submitted_by"] == "alice"
    assert _problem(c.post("/v1/jobs", json=spec().dict(), headers=_as(BOB)), 403)[
        "errors"][0]["field"] == "team"
    lang = c.post("/v1/jobs", json=spec().team("language").dict(), headers=_as(BOB)).json()
    # bob sees and cancels only his team's jobs; another team's job looks missing
    _problem(c.get(f"/v1/jobs/{vision['id']}", headers=_as(BOB)), 404)
    _problem(c.get(f"/v1/jobs/{vision['id']}/events", headers=_as(BOB)), 404)
    _problem(c.post(f"/v1/jobs/{vision['id']}/cancel", headers=_as(BOB)), 404)
    assert [j["id"] for j in c.get("/v1/jobs", headers=_as(BOB)).json()["items"]] == [lang["id"]]
    _problem(c.get("/v1/jobs", params={"team": "vision"}, headers=_as(BOB)), 403)
    # the admin sees everything and may cancel anyone's job
    assert len(c.get("/v1/jobs", headers=_as(ROOT)).json()["items"]) == 2
    cancelled = c.post(f"/v1/jobs/{vision['id']}/cancel", headers=_as(ROOT)).json()
    assert (cancelled["state"], cancelled["reason"]) == ("CANCELLED", "CancelledByAdmin")


def _after(*refs: str) -> dict[str, Any]:
    return spec().set("scheduling", {"dependencies": [
        {"kind": "afterok", "jobs": list(refs)}]}).dict()


def test_a_dependency_on_another_teams_job_is_refused_at_submit_as_an_unknown_one(
        secured: TestClient) -> None:
    """Issue 34: a dependency names a job of the submitting team, or the submission is refused
    (sbatch's "Job dependency problem"); another team's job and no job read the same, so the
    answer tells nothing of the other team. A number stands for the job's id."""
    c = secured
    lang = c.post("/v1/jobs", json=spec().team("language").dict(), headers=_as(BOB)).json()
    mine = c.post("/v1/jobs", json=spec().dict(), headers=_as(ALICE)).json()
    answers = []
    for ref in (lang["id"], str(lang["number"]), "06h0000000000000", "999999"):
        body = _problem(c.post("/v1/jobs", json=_after(mine["id"], ref), headers=_as(ALICE)),
                        422)
        (error,) = body["errors"]
        assert error["field"] == "scheduling.dependencies[0].jobs[1]", body
        answers.append(error["message"].replace(ref, "REF"))
    assert len(set(answers)) == 1 and "does not exist in team vision" in answers[0], answers
    assert "language" not in answers[0] and lang["state"] not in answers[0]
    # nothing was stored for the refused submissions
    assert len(c.get("/v1/jobs", headers=_as(ALICE)).json()["items"]) == 1
    by_number = c.post("/v1/jobs", json=_after(str(mine["number"])), headers=_as(ALICE))
    assert by_number.status_code == 201, by_number.text
    assert by_number.json()["spec"]["scheduling"]["dependencies"] == [
        {"kind": "afterok", "jobs": [mine["id"]]}]


def test_403_is_for_another_teams_spec_and_422_for_every_other_problem(secured: TestClient) -> None:
    """The status follows what the problem is, not its wording: an unknown team whose name
    (and so the message) says "token" is still a 422, and another team's spec a 403."""
    c = secured
    other = _problem(c.post("/v1/jobs", json=spec().team("language").dict(), headers=_as(ALICE)),
                     403)
    assert other["errors"] == [{"field": "team", "message": other["errors"][0]["message"]}]
    for who in (ROOT, ALICE):  # an admin (no team check) and a user (the unknown team wins)
        unknown = _problem(c.post("/v1/jobs", json=spec().team("tokens").dict(), headers=_as(who)),
                           422)
        (error,) = unknown["errors"]
        assert error["field"] == "team" and "token" in error["message"]


def test_every_route_taking_a_team_documents_its_403(secured: TestClient) -> None:
    """Issue 34: a user naming another team gets a 403; a route with a `team` parameter says
    so in its OpenAPI document (GET /v1/hpc/jobs did not)."""
    doc = secured.get("/openapi.json").json()
    taking = [(method, path) for path, item in doc["paths"].items()
              for method, op in item.items()
              if any(p.get("name") == "team" for p in op.get("parameters", []))]
    assert ("get", "/v1/hpc/jobs") in taking and ("get", "/v1/jobs") in taking
    for method, path in taking:
        assert "403" in doc["paths"][path][method]["responses"], (method, path)
    _problem(secured.get("/v1/hpc/jobs", params={"team": "language"}, headers=_as(ALICE)), 403)


def test_openapi_documents_the_jobspec(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert "JobSpec" in doc["components"]["schemas"]
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/JobSpec"
    assert "Gang" in doc["components"]["schemas"]


def test_openapi_documents_problems_and_the_bearer_scheme(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        **doc["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"
    }
    assert {"bearerAuth": []} in doc["security"]
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert {"type", "title", "status", "detail"} <= set(
        doc["components"]["schemas"]["Problem"]["properties"]
    )
    submit = doc["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"400", "401", "403", "409", "413", "415", "422"} <= set(submit)
    for path, item in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in item.items():
            for status in ("401", "422"):
                content = op["responses"][status]["content"]
                assert content == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, (method, path, status)


def test_a_submit_takes_no_worker_thread_hop(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17: the submit path's dependencies run on the event loop; a sync one would be
    sent to anyio's thread pool and back for every request."""
    import anyio.to_thread

    hops: list[object] = []
    real = anyio.to_thread.run_sync

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    r = client.post("/v1/jobs", json=spec().build().model_dump(mode="json"),
                    headers={"Idempotency-Key": "no-hop"})
    assert r.status_code == 201, r.text
    assert hops == []


def test_a_job_read_opens_one_read_transaction(client: TestClient, db: Database,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read route reads the job and what it shows beside it (its wait, last checkpoint,
    verdicts, events; a page's waits) in one read transaction: each costs the server more
    CPU than a statement does."""
    job = client.post("/v1/jobs", json=spec().dict()).json()["id"]
    opened: list[int] = []
    real = db.read

    def counted() -> Any:
        opened.append(1)
        return real()

    monkeypatch.setattr(db, "read", counted)
    for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/explain", f"/v1/jobs/{job}/events",
                 "/v1/jobs?limit=5"):
        opened.clear()
        assert client.get(path).status_code == 200, path
        assert len(opened) == 1, (path, len(opened))
