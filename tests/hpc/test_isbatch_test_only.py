"""isbatch --test-only: asks the broker's what-if (POST /v1/plan) where and when the job would
start and says it as `sbatch --test-only` does, storing nothing. Against a real `isthmus server`
on the simulated federation of examples/isthmus.yaml (partition a100 mapped to Slurm only, so
that where a job goes is known)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from broker.dropins import isbatch
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.server import Server
from tests.harness.wait import wait_until

# sbatch 22.05's line (checked on deploy/testenv/slurm):
# "sbatch: Job 2061 to start at 2026-12-01T06:53:28 using 2 processors on nodes a100-[1-2] in
# partition a100"
WOULD_START = re.compile(
    r"^isbatch: Job (\S+) to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d) using (\d+) processors "
    r"on nodes (\S+) in partition (\S+)$", re.M)
SCRIPT = """#!/bin/bash
#SBATCH -J pretrain
#SBATCH -A vision
#SBATCH -p a100
#SBATCH -N 2
#SBATCH --gres=gpu:a100:8
#SBATCH -c 4
#SBATCH -t 30
srun hostname
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("test-only")
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["slurm_compat"]["partitions"]["a100"]["backend"] = "slurm"
    cfg = tmp / "isthmus.yaml"
    cfg.write_text(yaml.safe_dump(data))
    srv = Server(cfg, f"sqlite:///{tmp / 'isthmus.db'}", tmp / "server.log").start()
    yield srv
    srv.stop()


ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


@pytest.fixture(autouse=True)
def _idle_after(server: Server) -> Iterator[None]:
    """Each test starts on an idle federation: the jobs a test left are cancelled and gone."""
    yield
    for job in _jobs(server):
        if job["state"] not in ENDED:
            httpx.post(f"{server.url}/v1/jobs/{job['id']}/cancel", timeout=30)
    wait_until(lambda: all(j["state"] in ENDED for j in _jobs(server)), 120, "jobs ended")


def _env(server: Server, home: Path) -> dict[str, str]:
    return {"ISTHMUS_URL": server.url, "HOME": str(home)}


def _jobs(server: Server) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/v1/jobs", params={"limit": 500}, timeout=30)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def _script(tmp_path: Path, text: str = SCRIPT) -> str:
    path = tmp_path / "job.sh"
    path.write_text(text)
    return str(path)


def _current_pool(server: Server, job_id: str) -> str | None:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/attempts", timeout=30)
    attempts = r.json() if r.status_code == 200 else []
    return attempts[-1]["pool"] if attempts else None


def test_a_fitting_job_says_where_and_now_and_admission_agrees(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(server, tmp_path)
    before = len(_jobs(server))
    assert isbatch.run(["--test-only", _script(tmp_path)], env) == 0
    err = capsys.readouterr().err
    m = WOULD_START.search(err)
    assert m, err
    name, at, cpus, nodes, pool = m.groups()
    assert (name, cpus, pool) == ("pretrain", "8", "slurm-a100")  # 2 nodes x 4 cpus
    assert re.fullmatch(r"slurm-a100-n\[\d{4}-\d{4}\]|slurm-a100-n\d{4},\S+", nodes), nodes
    started = datetime.strptime(at, "%Y-%m-%dT%H:%M:%S").astimezone(UTC)
    assert abs(started - datetime.now(UTC)) < timedelta(minutes=2)
    assert "would wait" not in err
    assert len(_jobs(server)) == before  # nothing stored

    # the same script for real lands where the plan said
    assert isbatch.run(["--parsable", _script(tmp_path)], env) == 0
    job_id = capsys.readouterr().out.strip()
    assert wait_until(lambda: _current_pool(server, job_id), 60, "placement") == "slurm-a100"


def test_a_job_too_big_would_be_rejected_and_nothing_is_stored(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(server, tmp_path)
    before = len(_jobs(server))
    assert isbatch.run(["--test-only", "-N", "40", _script(tmp_path)], env) == 1
    err = capsys.readouterr().err
    assert "isbatch: error: Job pretrain would be rejected (ExceedsCapacity)" in err, err
    assert not WOULD_START.search(err)
    assert len(_jobs(server)) == before


def test_a_job_behind_a_full_pool_gets_a_later_start_and_its_reason(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 3-node job holds every node of slurm-a100 for its declared hour (60 simulated minutes,
    6 wall minutes at the example's speed 10): the plan of another job names that pool's nodes
    and a start minutes away, and why it would wait."""
    env = _env(server, tmp_path)
    assert isbatch.run(["--parsable", "-J", "filler", "-N", "3", "-t", "60",
                        _script(tmp_path)], env) == 0
    filler = capsys.readouterr().out.strip()
    wait_until(lambda: httpx.get(f"{server.url}/v1/jobs/{filler}", timeout=30)
               .json()["state"] == "RUNNING", 60, "the filler running")
    before = len(_jobs(server))
    assert isbatch.run(["--test-only", "-N", "1", _script(tmp_path)], env) == 0
    err = capsys.readouterr().err
    m = WOULD_START.search(err)
    assert m, err
    started = datetime.strptime(m.group(2), "%Y-%m-%dT%H:%M:%S").astimezone(UTC)
    assert started - datetime.now(UTC) > timedelta(minutes=2), err
    assert m.group(5) == "slurm-a100" and m.group(4).startswith("slurm-a100-n"), err
    assert re.search(r"^isbatch: Job pretrain would wait.*: InsufficientCapacity: ", err,
                     re.M), err
    assert len(_jobs(server)) == before


def test_json_gives_the_spec_and_the_plan(server: Server, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert isbatch.run(["--test-only", "--json", "-p", "h100", "--gres=gpu:h100:8", "-N", "1",
                        _script(tmp_path)], _env(server, tmp_path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spec"]["flavors"] == ["h100-80g"]
    plan = out["plan"]
    assert plan["basis"] == "admission" and plan["would_reject"] is False
    assert plan["explanation"]["pools"], plan
    if plan["admitted"]:
        assert plan["pool"] == plan["explanation"]["placement"]["pool"]
        assert len(plan["nodes"]) == 1
