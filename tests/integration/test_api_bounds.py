"""Bounded input at the door: every bad value is a 4xx problem naming the field (and the limit),
never a 500, on both databases. Each case was a 500 or a silent acceptance before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig
from broker.store import Database
from broker.store import attempts as att
from tests.builders import spec

PROBLEM = "application/problem+json"


@pytest.fixture
def client(db: Database, example_config: IsthmusConfig) -> Iterator[TestClient]:
    with TestClient(create_app(example_config, db), raise_server_exceptions=False) as c:
        yield c


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


def _with(path: str, value: Any) -> dict[str, Any]:
    """The canonical spec with `value` at the dotted `path` (created as needed)."""
    data = spec().dict()
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


RAW = "__RAW__"


def _raw(path: str, literal: str) -> bytes:
    """A body whose `path` holds a JSON literal Python's json module will not write (1e400)."""
    return json.dumps(_with(path, RAW)).replace(f'"{RAW}"', literal).encode()


# (id, body, field, words the message must contain)
REFUSED: list[tuple[str, dict[str, Any] | bytes, str, str]] = [
    # control characters, in every kind of string (finding 1: NUL reached PostgreSQL)
    ("nul-in-queue", _with("queue", "a\x00b"), "queue", "control character"),
    ("nul-in-team", _with("team", "vision\x00"), "team", "control character"),
    ("escape-in-command", _with("entrypoint.command", ["python", "a\x1b[2Jb"]),
     "entrypoint.command.1", "control character"),
    ("nul-in-env-value", _with("env", {"A": "x\x00y"}), "env.A", "control character"),
    ("nul-in-label-value", _with("labels", {"a": "b\x00"}), "labels.a", "control character"),
    ("nul-in-script", _with("entrypoint", {"script": "#!/bin/sh\necho \x00\n"}),
     "entrypoint.script", "control character"),
    ("cr-in-script", _with("entrypoint", {"script": "#!/bin/sh\r\necho hi\r\n"}),
     "entrypoint.script", "control character"),
    ("nul-in-code-version", _with("code_version", "v1\x00"), "code_version",
     "control character"),
    ("nul-in-mount-path", _with("mounts", [{"name": "ds", "path": "/data\x00"}]),
     "mounts.0.path", "control character"),
    # non-string sizes and durations (finding 2: `.strip()` on a list)
    ("max-runtime-list", _with("max_runtime", [1]), "max_runtime", "duration"),
    ("max-runtime-dict", _with("max_runtime", {}), "max_runtime", "duration"),
    ("memory-list", _with("gang.memory_per_replica", ["64Gi"]), "gang.memory_per_replica",
     "size"),
    ("grace-null-object", _with("checkpoint.grace", {"s": 1}), "checkpoint.grace", "duration"),
    # infinities and huge numbers (finding 2: int(inf))
    ("max-runtime-1e400", _raw("max_runtime", "1e400"), "max_runtime", "finite"),
    ("max-runtime-infinity", _raw("max_runtime", "Infinity"), "max_runtime", "finite"),
    ("max-runtime-nan", _raw("max_runtime", "NaN"), "max_runtime", "finite"),
    ("max-runtime-9x400", _with("max_runtime", "9" * 400), "max_runtime", "at most"),
    ("memory-9x400", _with("gang.memory_per_replica", "9" * 400), "gang.memory_per_replica",
     "at most"),
    ("memory-9x400-gi", _with("gang.memory_per_replica", "9" * 400 + "Gi"),
     "gang.memory_per_replica", "at most"),
    ("memory-1e400", _raw("gang.memory_per_replica", "1e400"), "gang.memory_per_replica",
     "size"),
    ("wasted-infinity", _raw("retry.max_wasted_gpu_hours", "Infinity"),
     "retry.max_wasted_gpu_hours", "finite"),
    # unbounded values (finding 3)
    ("grace-1e15", _with("checkpoint.grace", 10**15), "checkpoint.grace", "at most"),
    ("backoff-1e12", _with("retry.backoff", 10**12), "retry.backoff", "at most"),
    ("max-backoff-1e12", _with("retry.max_backoff", 10**12), "retry.max_backoff", "at most"),
    ("max-runtime-1e12", _with("max_runtime", 10**12), "max_runtime", "at most"),
    ("max-runtime-11574074d", _with("max_runtime", "11574074d"), "max_runtime", "at most"),
    ("max-runtime-10e400", _raw("max_runtime", "1" + "0" * 400), "max_runtime", "at most"),
    ("memory-10e400", _raw("gang.memory_per_replica", "1" + "0" * 400),
     "gang.memory_per_replica", "at most"),
    ("cpus-1e30", _with("gang.cpus_per_replica", 10**30), "gang.cpus_per_replica",
     "less than or equal"),
    ("wasted-1e30", _with("retry.max_wasted_gpu_hours", 1e30), "retry.max_wasted_gpu_hours",
     "less than or equal"),
    ("interval-1e12", _with("checkpoint.interval", 10**12), "checkpoint.interval", "at most"),
    ("min-gpu-memory-1e30", _with("constraints", {"min_gpu_memory_gb": 10**30}),
     "constraints.min_gpu_memory_gb", "less than or equal"),
    # strict integers: no bool, no string, no float coercion
    ("replicas-true", _with("gang.replicas", True), "gang.replicas", "integer"),
    ("replicas-string", _with("gang.replicas", "2"), "gang.replicas", "integer"),
    ("gpus-fraction", _with("gang.gpus_per_replica", 7.5), "gang.gpus_per_replica", "integer"),
    ("attempts-string", _with("retry.max_attempts", "3"), "retry.max_attempts", "integer"),
    ("max-runtime-bool", _with("max_runtime", True), "max_runtime", "boolean"),
    # collections: counts and lengths
    ("env-count", _with("env", {f"V{i}": "x" for i in range(300)}), "env", "at most"),
    ("env-value-length", _with("env", {"A": "x" * 40_000}), "env.A", "at most"),
    ("mounts-count", _with("mounts", [{"name": f"d{i}", "path": f"/d{i}"} for i in range(40)]),
     "mounts", "at most"),
    ("command-count", _with("entrypoint.command", ["x"] * 2000), "entrypoint.command",
     "at most"),
    ("flavors-count", _with("flavors", [f"f{i}" for i in range(40)]), "flavors", "at most"),
    ("annotation-value-length", _with("annotations", {"a": "x" * 70_000}), "annotations.a",
     "at most"),
    # the configurable limits (examples/isthmus.yaml keeps the defaults), checked at submit
    ("max-runtime-over-limit", _with("max_runtime", "31d"), "max_runtime", "30d"),
    ("grace-over-limit", _with("checkpoint.grace", "2h"), "checkpoint.grace", "1h"),
    ("backoff-over-limit", _with("retry.backoff", "2d"), "retry.backoff", "1d"),
    ("max-backoff-over-limit", _with("retry.max_backoff", "25h"), "retry.max_backoff", "1d"),
    ("interval-over-limit", _with("checkpoint.interval", "31d"), "checkpoint.interval", "30d"),
    ("cpus-over-limit", _with("gang.cpus_per_replica", 1025), "gang.cpus_per_replica", "1024"),
    ("memory-over-limit", _with("gang.memory_per_replica", "17Ti"), "gang.memory_per_replica",
     "16Ti"),
    ("wasted-over-limit", _with("retry.max_wasted_gpu_hours", 2e6),
     "retry.max_wasted_gpu_hours", "1000000"),
]


@pytest.mark.parametrize(
    ("body", "field", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_out_of_bounds_spec_is_a_422_naming_the_field_and_the_limit(
    client: TestClient, body: dict[str, Any] | bytes, field: str, words: str
) -> None:
    if isinstance(body, bytes):
        r = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/jobs", json=body)
    problem = _problem(r, 422)
    messages = {e["field"]: e["message"] for e in problem["errors"]}
    assert field in messages, problem
    assert words in messages[field], messages[field]
    assert client.get("/v1/jobs").json()["items"] == []


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("limits-exactly", _with("max_runtime", "30d") | {
        "checkpoint": {"grace": "1h", "interval": "30d"},
        "retry": {"backoff": "1d", "max_backoff": 86400, "max_wasted_gpu_hours": 1e6},
        "gang": {"replicas": 2, "gpus_per_replica": 8, "cpus_per_replica": 1024,
                 "memory_per_replica": "16Ti"},
    }),
    ("script-with-newlines-and-tabs", _with("entrypoint", {"script": "#!/bin/sh\n\techo hi\n"})),
    ("duration-as-number", _with("max_runtime", 3600)),
    ("size-as-number", _with("gang.memory_per_replica", 2**30)),
    ("fractional-size", _with("gang.memory_per_replica", "1.5Gi")),
    ("unicode-text", _with("env", {"GREETING": "grüß dich ✓"})),
    ("multi-line-argument-and-env", _with("entrypoint.command", ["bash", "-c", "a\n\tb"])
     | {"env": {"CERT": "-----BEGIN-----\nabc\n-----END-----"}}),
]


@pytest.mark.parametrize("body", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_values_at_the_limits_are_accepted(client: TestClient, body: dict[str, Any]) -> None:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text


def test_empty_idempotency_key_is_a_400(client: TestClient) -> None:
    for key in ("", "   ", "a\x01b"):
        r = client.post("/v1/jobs", json=spec().dict(), headers={"Idempotency-Key": key})
        problem = _problem(r, 400)
        assert problem["errors"][0]["field"] == "Idempotency-Key"
    assert client.get("/v1/jobs").json()["items"] == []


@pytest.mark.parametrize(
    "query",
    ["team=%00", "team=a%00b", "cursor=%00", "team=%1b", "state=%00"],
)
def test_control_characters_in_query_strings_are_a_4xx(client: TestClient, query: str) -> None:
    r = client.get(f"/v1/jobs?{query}")
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"].startswith(PROBLEM)


@pytest.mark.parametrize("number", ["0", "-1", str(2**31), str(2**63), str(2**70), "1e3"])
def test_attempt_numbers_beyond_the_column_range_are_a_4xx(
    client: TestClient, number: str
) -> None:
    job = client.post("/v1/jobs", json=spec().dict()).json()
    r = client.get(f"/v1/jobs/{job['id']}/attempts/{number}/render")
    assert r.status_code in (404, 422), r.text
    assert r.headers["content-type"].startswith(PROBLEM)


def test_nul_in_the_drain_reason_is_a_422(client: TestClient) -> None:
    r = client.post("/v1/admin/pools/slurm-h100/drain", json={"reason": "fw\x00update"})
    assert _problem(r, 422)["errors"][0]["field"] == "reason"
    pools = {p["name"]: p for p in client.get("/v1/admin/pools").json()}
    assert pools["slurm-h100"]["drained"] is False


@pytest.mark.parametrize("job_id", ["%00", "a%00b", "0000000000000000%00"])
def test_progress_on_a_malformed_job_id_is_a_4xx(client: TestClient, job_id: str) -> None:
    r = client.post(f"/v1/jobs/{job_id}/progress", json={"step": 1},
                    headers={"Authorization": "Bearer x"})
    assert 400 <= r.status_code < 500, r.text


def test_method_not_allowed_carries_allow(client: TestClient) -> None:
    r = client.delete("/v1/jobs")
    _problem(r, 405)
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_render_of_an_attempt_its_backend_renders_nothing_says_why(
        client: TestClient, db: Database) -> None:
    job = client.post("/v1/jobs", json=spec().dict()).json()
    with db.write() as s:
        att.insert_attempt(s, att.AttemptRecord(
            job_id=job["id"], number=1, snapshot_json="{}", spec_hash="x",
            backend_name=f"isthmus-{job['id']}-1", created_at=datetime.now(UTC),
            backend="sim-slurm", pool="slurm-h100", flavor="h100-80g", gpus=8,
            dispatch=att.CREATED, phase="RUNNING", preempted=False))
    detail = _problem(client.get(f"/v1/jobs/{job['id']}/attempts/1/render"), 404)["detail"]
    assert "sim-slurm, which sends no script or manifest" in detail
    assert "no backend object yet" not in detail
