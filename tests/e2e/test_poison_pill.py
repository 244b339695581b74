"""One job never harms another, on the real backends: a job with every field at its maximum
and a job whose values no backend can render are submitted with 20 ordinary jobs from two
teams to one broker over the real Slurm cluster and the real Kubernetes control plane. Every
ordinary job must run and succeed; the two bad ones are refused at submit or end (or wait)
with a reason that names their problem."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.orchestration.replay import check_all
from broker.store import open_database
from tests.harness.server import (
    FAKE,
    Server,
    job_spec,
    k8s_backend,
    k8s_pools,
    slurm_backend,
    slurm_pools,
    write_config,
)
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]

TEAMS = [
    {"name": "vision", "cohort": "research",
     "quotas": {"h100-80g": {"nominal": 128}, "a100-80g": {"nominal": 128}}},
    {"name": "speech", "cohort": "research",
     "quotas": {"h100-80g": {"nominal": 128}, "a100-80g": {"nominal": 128}}},
]
# Reasons that name what is wrong with a bad job (never a silent wait)
BAD_JOB_REASONS = {"DispatchRefused", "PoolExcluded", "InternalError",
                   "ExceedsCapacity", "TopologyUnsatisfiable", "Orchestration",
                   "RetriesExhausted", "UserError", "ResourceEnv"}


def _ordinary() -> list[dict[str, Any]]:
    jobs = []
    for i in range(20):
        team = ("vision", "speech")[i % 2]
        on_slurm = i < 10
        spec = job_spec(f"ok-{i}", ("a100-80g", "h100-80g")[i // 2 % 2], gpus=2,
                        backend="slurm" if on_slurm else "k8s",
                        command=["sleep", "4"] if on_slurm else None)
        spec["team"] = team
        if not on_slurm:
            spec["annotations"] = {f"{FAKE}duration": "4s"}
        jobs.append(spec)
    return jobs


def _maximal() -> dict[str, Any]:
    """Every bounded field at its documented maximum (README, "Limits")."""
    spec = job_spec("maximal", "a100-80g", replicas=1, gpus=8, backend="slurm")
    spec["gang"].update({"cpus_per_replica": 1024, "memory_per_replica": "16Ti"})
    spec["max_runtime"] = "30d"
    spec["checkpoint"] = {"grace": "1h", "interval": "30d", "resumable": True,
                          "dir": "/ckpt/maximal"}
    spec["retry"] = {"max_attempts": 20, "backoff": "1d", "max_backoff": "1d"}
    return spec


def _unrenderable() -> dict[str, Any]:
    """Values no backend can carry (a runtime and a memory size of 10**400): refused at the
    door, or, if they ever got in, refused by the renderer for this job alone."""
    spec = job_spec("unrenderable", "a100-80g", gpus=2)
    spec["team"] = "speech"
    spec["max_runtime"] = 10**400
    spec["gang"]["memory_per_replica"] = 10**400
    return spec


def _reached_running(server: Server, job_id: str) -> bool:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/events", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    events = body["events"] if isinstance(body, dict) else body
    return any(e["to_state"] == "RUNNING" for e in events)


def test_bad_jobs_do_not_stop_twenty_ordinary_ones(
    slurm_cluster: Any, k8s_cluster: Any, tmp_path: Path, workdir: Path
) -> None:
    # unique per run: a namespace of an earlier run may still be terminating
    namespace = f"isthmus-pill-{uuid.uuid4().hex[:8]}"
    cfg = write_config(
        tmp_path / "isthmus.yaml",
        [slurm_backend(slurm_cluster, workdir), k8s_backend(k8s_cluster, namespace)],
        slurm_pools() + k8s_pools(), teams=TEAMS,
    )
    db_url = f"sqlite:///{tmp_path / 'isthmus.db'}"
    server = Server(cfg, db_url, tmp_path / "server.log").start()
    bad: dict[str, str] = {}
    refused: dict[str, httpx.Response] = {}
    try:
        for spec in (_maximal(), _unrenderable()):  # the bad ones first: oldest in every queue
            r = httpx.post(f"{server.url}/v1/jobs", json=spec, timeout=30)
            if r.status_code == 422:
                refused[spec["name"]] = r
            else:
                assert r.status_code == 201, r.text
                bad[spec["name"]] = r.json()["id"]
        ids = [server.submit(spec)["id"] for spec in _ordinary()]

        def settled() -> bool:
            return all(server.job(i)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                       for i in ids)

        wait_until(settled, 420, "every ordinary job to end", interval=2)
        jobs = {i: server.job(i) for i in ids}
        assert all(j["state"] == "SUCCEEDED" for j in jobs.values()), [
            (j["spec"]["name"], j["state"], j["reason"], j["message"]) for j in jobs.values()
            if j["state"] != "SUCCEEDED"
        ]
        assert all(_reached_running(server, i) for i in ids)
        assert {j["spec"]["team"] for j in jobs.values()} == {"vision", "speech"}
        for name, r in refused.items():  # refused at the door: the problem names the field
            assert r.headers["content-type"].startswith("application/problem+json"), name
            assert r.json()["errors"], (name, r.text)
        for name, job_id in bad.items():
            job = server.job(job_id)
            assert job["reason"] in BAD_JOB_REASONS or job["state"] == "REJECTED", (name, job)
            assert job["message"], (name, job)
        assert "unrenderable" in refused, "10**400 is refused at the door"
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            k8s_cluster.delete_namespace(namespace)
    db = open_database(db_url, migrate=False)
    try:
        with db.read() as s:
            assert list(check_all(s)) == [], "the event log replays to every stored job"
    finally:
        db.dispose()
