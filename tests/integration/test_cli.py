"""The `isthmus` command against a real server process on both databases."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.paths import EXAMPLE_CONFIG

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
ISTHMUS = [sys.executable, "-m", "broker.cli.main"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env_url = ["--server", url] if url else []
    cmd = [*ISTHMUS, *args]
    if url and args[0] not in ("db", "config", "server"):
        cmd = [*ISTHMUS, args[0], *env_url, *args[1:]]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    port = _port()
    proc = subprocess.Popen(
        [*ISTHMUS, "server", "--config", str(EXAMPLE_CONFIG), "--db", db_url, "--port", str(port),
         "--no-control"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
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


def test_submit_status_events_cancel_and_db_check(server: str, db_url: str) -> None:
    out = run("submit", "-f", str(JOBS / "llama-ft.json"), "--json", url=server)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "QUEUED"

    human = run("status", job["id"], url=server)
    assert human.returncode == 0 and "WaitingForAdmission" in human.stdout
    by_number = run("status", str(job["number"]), "--json", url=server)  # the id tools see
    assert by_number.returncode == 0 and json.loads(by_number.stdout)["id"] == job["id"]
    assert run("explain", str(job["number"]), url=server).returncode == 0
    assert "2 x 8 GPUs (16 total)" in human.stdout

    events = json.loads(run("events", job["id"], "--json", url=server).stdout)
    assert [e["to_state"] for e in events] == ["SUBMITTED", "VALIDATING", "QUEUED"]

    yaml_job = run("submit", "-f", str(JOBS / "vit-pretrain.yaml"), url=server)
    assert yaml_job.returncode == 0 and "QUEUED" in yaml_job.stdout
    too_big = run("submit", "-f", str(JOBS / "too-big.json"), url=server)
    assert too_big.returncode == 0 and "REJECTED (ExceedsCapacity)" in too_big.stdout
    # plan answers like `isbatch --test-only`: 1 when the job would be rejected, 0 when not
    for args in ((), ("--json",)):
        would = run("plan", "-f", str(JOBS / "too-big.json"), *args, url=server)
        assert would.returncode == 1 and "ExceedsCapacity" in would.stdout, would
        fits = run("plan", "-f", str(JOBS / "vit-pretrain.yaml"), *args, url=server)
        assert fits.returncode == 0, fits

    listed = json.loads(run("list", "--json", url=server).stdout)
    assert len(listed["items"]) == 3

    cancelled = run("cancel", job["id"], url=server)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout

    check = run("db", "check", "--db", db_url)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "checked 3 jobs: 0 mismatches, 0 ledger problems" in check.stdout


def test_errors_are_clear(server: str, tmp_path: Path) -> None:
    missing = run("status", "0000000000000000", url=server)
    assert missing.returncode == 1 and "Job not found" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "team": "vision", "gang": {"replicas": 0}}))
    refused = run("submit", "-f", str(bad), url=server)
    assert refused.returncode == 1
    assert "gang.replicas" in refused.stderr and "gang.gpus_per_replica" in refused.stderr
    unreachable = run("status", "0000000000000000", url="http://127.0.0.1:9")
    assert unreachable.returncode == 2 and "cannot reach" in unreachable.stderr


def test_server_refuses_open_auth_on_a_public_listener() -> None:
    out = run("server", "--config", str(EXAMPLE_CONFIG), "--host", "0.0.0.0", "--port", "1")
    assert out.returncode == 2
    assert "allowed only on a loopback listener" in out.stderr


def test_config_check(tmp_path: Path) -> None:
    ok = run("config", "check", str(EXAMPLE_CONFIG))
    assert ok.returncode == 0 and "OK: 2 backends, 4 pools" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_CONFIG.read_text().replace("flavor: a100-80g", "flavor: b200", 1))
    out = run("config", "check", str(bad))
    assert out.returncode == 1 and "pools[1].flavor: 'b200' is not in flavors" in out.stderr


def test_second_server_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    port = _port()
    first = subprocess.Popen(
        [*ISTHMUS, "server", "--config", str(EXAMPLE_CONFIG), "--db", url, "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120  # a busy machine starts a server slowly
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "first server did not start"
                time.sleep(0.1)
        second = run("server", "--config", str(EXAMPLE_CONFIG), "--db", url, "--port",
                     str(_port()))
        assert second.returncode == 2
        assert f"another Isthmus server (pid {first.pid})" in second.stderr
        assert "SQLite allows one server process" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=10)
