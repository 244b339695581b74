"""`isthmus server --workers N`: worker processes on one port (PostgreSQL), exactly one of
them running the control loop; refused on SQLite."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.harness.paths import EXAMPLE_CONFIG, ROOT
from tests.harness.server import Server, job_spec, write_config
from tests.harness.wait import wait_until


def _health(url: str) -> dict[str, Any]:
    # a new connection each time: the kernel hands it to one of the workers
    with httpx.Client(timeout=10) as client:
        r = client.get(f"{url}/healthz")
        assert r.status_code == 200, r.text
        return dict(r.json())


def _lease_holders(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return list(conn.execute("SELECT holder, epoch FROM leader_lease"))


def _parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


@pytest.mark.postgres
def test_two_workers_both_answer_and_one_leads(tmp_path: Path, pg_server: object,
                                               pg_template: str) -> None:
    db_url = pg_server.url(pg_server.new_database(pg_template))  # type: ignore[attr-defined]
    cfg = write_config(tmp_path / "isthmus.yaml", backends=[], pools=[])
    server = Server(cfg, db_url, tmp_path / "server.log", args=("--workers", "2")).start()
    seen: list[dict[str, Any]] = []
    try:
        def both_roles() -> bool:
            with ThreadPoolExecutor(8) as pool:
                seen.extend(pool.map(lambda _: _health(server.url), range(16)))
            return {h["control"] for h in seen} == {"leader", "standby"}

        # one worker leads, the other answers as a standby: two processes answered
        wait_until(both_roles, 60, "answers from a leading and a standby worker")
        wait_until(lambda: len(seen) >= 200, 60, "more answers", between=both_roles)
        assert {h["control"] for h in seen} == {"leader", "standby"}
        epochs = {h["epoch"] for h in seen if h["control"] == "leader"}
        assert len(epochs) == 1  # one leader all along: no hand-over between the workers
        [(holder, epoch)] = _lease_holders(db_url)
        assert {epoch} == epochs
        assert server.proc is not None
        assert _parent_of(int(holder.split(":")[1])) == server.proc.pid  # one of the workers
        # both workers store submissions; every one is readable through either
        ids = [server.submit(job_spec(f"w-{i}", "a100-80g"))["id"] for i in range(20)]
        assert all(server.job(i)["state"] in ("QUEUED", "REJECTED") for i in ids)
    finally:
        server.stop()  # SIGTERM: uvicorn's supervisor stops its workers
    assert server.proc is not None and server.proc.returncode is not None


def test_workers_refused_on_sqlite(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli.main", "server", "--config", str(EXAMPLE_CONFIG),
         "--db", f"sqlite:///{tmp_path / 'one.db'}", "--port", "1", "--workers", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert "--workers 2 needs PostgreSQL" in out.stderr
    assert "postgresql://" in out.stderr
    assert not (tmp_path / "one.db").exists()  # refused before anything was created
