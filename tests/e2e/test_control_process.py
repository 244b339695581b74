"""`isthmus control`: the control loop in a process of its own, beside an API-only server
(`isthmus server --no-control`) on one PostgreSQL. A submit to the API wakes the control
process's admission (NOTIFY; its interval here is 10 minutes) and the job runs to success;
the API process never leads, and the loop's metrics are served by its own process; SIGTERM
stops the loop and gives the lease back. Refused on SQLite."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.harness.paths import EXAMPLE_CONFIG, ROOT
from tests.harness.server import FAST_CONTROL, Server, free_port, write_config
from tests.harness.wait import wait_until


def _sim_config(path: Path) -> Path:
    cap = {"nodes": 4, "gpus_per_node": 8, "nodes_per_rack": 2, "racks_per_block": 2}
    backends = [{"name": "sim-a", "kind": "sim",
                 "settings": {"emulate": "slurm", "speed": 10, "start_delay": 1, "seed": 1}}]
    pools = [{"name": "sim-a-a100", "backend": "sim-a", "flavor": "a100-80g", "capacity": cap,
              "partition": "a100"}]
    return write_config(path, backends, pools,
                        control={**FAST_CONTROL, "admission_interval": 600.0},
                        tenancy={"exempt_key_prefixes": ["isthmus.io/sim-"]})


def _lease(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return list(conn.execute("SELECT holder, expires_at > now() FROM leader_lease"))


@pytest.mark.postgres
def test_an_api_only_server_and_a_control_process_run_a_job(tmp_path: Path, pg_server: Any,
                                                            pg_template: str) -> None:
    db_url = pg_server.url(pg_server.new_database(pg_template))
    cfg = _sim_config(tmp_path / "isthmus.yaml")
    api = Server(cfg, db_url, tmp_path / "api.log", args=("--no-control",)).start()
    metrics = free_port()
    with open(tmp_path / "control.log", "ab") as log:
        loop = subprocess.Popen(
            [sys.executable, "-m", "broker.cli.main", "control", "--config", str(cfg),
             "--db", db_url, "--api-port", str(api.port), "--metrics-port", str(metrics)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        def leading() -> bool:
            assert loop.poll() is None, (tmp_path / "control.log").read_text()[-3000:]
            return any(h.split(":")[1] == str(loop.pid) and live for h, live in _lease(db_url))

        wait_until(leading, 120, "the control process to take the lease")
        health = api.healthy()
        assert health is not None and health["control"] == "off"
        job = api.submit({
            "name": "split", "team": "vision", "flavors": ["a100-80g"],
            "gang": {"replicas": 2, "gpus_per_replica": 4},
            "entrypoint": {"image": "registry.local/train:1.0", "command": ["python", "t.py"]},
            "max_runtime": "10m", "annotations": {"isthmus.io/sim-duration": "20"},
        })["id"]
        # the poll gives up long before the admission interval (120 s < 600 s): only the
        # NOTIFY wake can get the job there in time
        wait_until(lambda: api.job(job)["state"] == "SUCCEEDED", 120,
                   "the job to be admitted (woken by NOTIFY), run and end", interval=0.2)
        # the control loop's own metrics are served by its process, not by the API's
        text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        cycles = [line for line in text.splitlines()
                  if line.startswith("isthmus_admission_cycle_seconds_count")]
        assert cycles and float(cycles[0].split()[-1]) >= 2, cycles
    finally:
        if loop.poll() is None:
            loop.send_signal(signal.SIGTERM)
            loop.wait(timeout=60)
        api.stop()
    assert loop.returncode == 0, (tmp_path / "control.log").read_text()[-3000:]
    assert not any(live for _, live in _lease(db_url))  # the lease was given back


def test_control_process_refused_on_sqlite(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli.main", "control", "--config", str(EXAMPLE_CONFIG),
         "--db", f"sqlite:///{tmp_path / 'one.db'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "isthmus control needs PostgreSQL" in out.stderr
    assert not (tmp_path / "one.db").exists()
