"""`isthmus admin approve / refuse / approvals` and the concurrency limits in `isthmus quotas`,
against a real server process (control loop off) on both databases."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.server import free_port

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
ISTHMUS = [sys.executable, "-m", "broker.cli.main"]

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[str]:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["priority_classes"].append({"name": "urgent", "value": 2000, "approval": "required"})
    vision = next(t for t in data["teams"] if t["name"] == "vision")
    vision["limits"] = {"running_jobs": 4, "queued_jobs": 10, "gpus": 64}
    vision["budgets"] = [{"period": "month", "gpu_hours": 5000, "enforce": "lowest"}]
    vision["queues"] = [{"name": "default"}, {"name": "prod", "weight": 3}]
    data["user_limits"] = {"queued_jobs": 5}
    config = tmp_path / "isthmus.yaml"
    config.write_text(yaml.safe_dump(data))
    port = free_port()
    proc = subprocess.Popen(
        [*ISTHMUS, "server", "--config", str(config), "--db", db_url, "--port", str(port),
         "--no-control"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a busy machine starts a server slowly
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """One `isthmus` command, the server given last (it fits `admin` subcommands too)."""
    return subprocess.run(
        [*ISTHMUS, *args, *(("--server", url) if url else ())], capture_output=True,
        text=True, timeout=60, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def _urgent(tmp_path: Path, name: str) -> Path:
    job = json.loads((JOBS / "llama-ft.json").read_text())
    job.update(name=name, priority="urgent")
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(job))
    return path


def test_admin_approves_and_refuses_from_the_cli(server: str, db_url: str,
                                                  tmp_path: Path) -> None:
    ids = []
    for name in ("eval-a", "eval-b"):
        out = run("submit", "-f", str(_urgent(tmp_path, name)), "--json", url=server)
        assert out.returncode == 0, out.stderr
        ids.append(json.loads(out.stdout))
    a, b = ids
    approved = run("admin", "approve", str(a["number"]), "--note", "deadline", url=server)
    assert approved.returncode == 0, approved.stderr
    assert f"{a['id']}: QUEUED (Approved)" in approved.stdout and "by local" in approved.stdout
    twice = run("admin", "approve", a["id"], url=server)
    assert twice.returncode == 1 and "already approved by local" in twice.stdout + twice.stderr
    no_reason = run("admin", "refuse", b["id"], url=server)
    assert no_reason.returncode != 0 and "--reason" in no_reason.stderr
    refused = run("admin", "refuse", b["id"], "--reason", "use normal", url=server)
    assert refused.returncode == 0, refused.stderr
    assert "CANCELLED (ApprovalRefused)" in refused.stdout and "use normal" in refused.stdout
    events = json.loads(run("events", b["id"], "--json", url=server).stdout)
    assert (events[-1]["reason"], events[-1]["actor"]) == ("ApprovalRefused", "local")
    pending = json.loads(run("admin", "approvals", "--json", url=server).stdout)
    assert pending == []  # the hold phase (control loop off here) names no job yet
    check = run("db", "check", "--db", db_url)
    assert check.returncode == 0, check.stdout + check.stderr  # the decisions replay


def test_quotas_show_the_limits_queues_and_budgets(server: str) -> None:
    assert run("submit", "-f", str(JOBS / "llama-ft.json"), url=server).returncode == 0
    out = run("quotas", url=server)
    assert out.returncode == 0, out.stderr
    assert "Concurrency limits" in out.stdout
    cells = [[c for c in line.split() if c != "│"] for line in out.stdout.splitlines()]
    assert ["vision", "(team)", "0/4", "1/10", "0/64"] in cells
    assert ["vision", "local", "0", "1/5", "0"] in cells
    assert "GPU-hour budgets" in out.stdout
    assert "Team queues" in out.stdout  # the example job names queue 'default'
    assert ["vision", "1", "default", "1", "(25%)", "-", "0", "0", "1"] in cells, out.stdout
    assert ["vision", "1", "prod", "3", "(75%)", "-", "0", "0", "0"] in cells, out.stdout
    budget = next(c for c in cells if c[:3] == ["vision", "(team)", "month"])
    assert budget[3:7] == ["0.0/5000", "(0%)", "ok", "lowest"]
