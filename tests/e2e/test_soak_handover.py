"""A 30-second soak (bench/soak.py in small): steady submits to two replicas on one PostgreSQL
over the simulated federation, the leader killed with SIGKILL midway; every answered submit
ends as one job, run to success (its attempt lost with the dead leader's simulated backend is
retried by the new leader), none lost or duplicated, and `isthmus db check` is clean."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.paths import ROOT
from tests.harness.server import Server, write_config
from tests.harness.wait import wait_until

TEAMS = ["vision", "language"]


def _sim_config(path: Path) -> Path:
    cap = {"nodes": 16, "gpus_per_node": 8, "nodes_per_rack": 8, "racks_per_block": 2}
    backends = [{"name": "sim-a", "kind": "sim", "settings": {"emulate": "slurm", "speed": 10,
                                                              "start_delay": 2, "seed": 1}},
                {"name": "sim-b", "kind": "sim", "settings": {"emulate": "k8s", "speed": 10,
                                                              "start_delay": 2, "seed": 2}}]
    pools = [{"name": f"{b}-a100", "backend": b, "flavor": "a100-80g", "capacity": cap,
              **({"partition": "a100"} if b == "sim-a" else
                 {"node_selector": {"isthmus.io/pool": "a100"}})} for b in ("sim-a", "sim-b")]
    teams = [{"name": t, "cohort": "research", "quotas": {"a100-80g": {"nominal": 128}}}
             for t in TEAMS]
    return write_config(path, backends, pools, teams=teams,
                        control={"lost_grace": 5.0},
                        tenancy={"exempt_key_prefixes": ["isthmus.io/sim-"]})


def _spec(i: int, rng: random.Random) -> dict[str, Any]:
    return {
        "name": f"soak-{i:05d}", "team": TEAMS[i % 2], "flavors": ["a100-80g"],
        "gang": {"replicas": 1, "gpus_per_replica": rng.choice([1, 2, 4, 8])},
        "entrypoint": {"image": "registry.local/train:1.0", "command": ["python", "t.py"]},
        "max_runtime": "10m", "annotations": {"isthmus.io/sim-duration": str(rng.randint(20, 80))},
        "retry": {"max_attempts": 4, "backoff": "1s", "max_backoff": "2s"},
    }


def _submit(servers: list[Server], spec: dict[str, Any]) -> str:
    """Submit to the first replica that answers (same Idempotency-Key on every try)."""
    deadline = time.monotonic() + 60
    while True:
        for s in servers:
            try:
                r = httpx.post(f"{s.url}/v1/jobs", json=spec, timeout=30,
                               headers={"Idempotency-Key": spec["name"]})
            except httpx.TransportError:
                continue
            assert r.status_code in (200, 201), r.text
            return str(r.json()["id"])
        assert time.monotonic() < deadline, "no replica answered a submit for 60 s"
        time.sleep(0.5)


@pytest.mark.postgres
def test_no_job_lost_or_duplicated_across_a_leader_kill(tmp_path: Path, pg_server: Any,
                                                        pg_template: str) -> None:
    db_url = pg_server.url(pg_server.new_database(pg_template))
    cfg = _sim_config(tmp_path / "isthmus.yaml")
    a = Server(cfg, db_url, tmp_path / "a.log").start(wait=False)
    b = Server(cfg, db_url, tmp_path / "b.log")
    servers = [a, b]
    rng = random.Random(17)
    acked: dict[str, str] = {}
    try:
        wait_until(a.healthy, 120, "replica a to answer")  # a busy machine starts slowly
        b.start(wait=False)
        wait_until(b.healthy, 120, "replica b to answer")
        wait_until(lambda: sorted(str((s.healthy() or {}).get("control")) for s in servers)
                   == ["leader", "standby"], 30, "one leader, one standby")
        leader = a if (a.healthy() or {})["control"] == "leader" else b
        standby = b if leader is a else a
        start, killed = time.monotonic(), False
        i = 0
        while time.monotonic() - start < 30:
            if not killed and time.monotonic() - start >= 15:
                leader.kill()  # SIGKILL: its simulated backend and running attempts vanish
                killed = True
            live = [s for s in (standby, leader) if s.alive()]
            spec = _spec(i, rng)
            acked[spec["name"]] = _submit(live, spec)
            i += 1
            time.sleep(0.1)
        wait_until(lambda: (standby.healthy() or {}).get("control") == "leader", 30,
                   "the standby to lead")

        def ended() -> list[dict[str, Any]] | None:
            jobs = _all_jobs(standby)
            return jobs if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")
                               for j in jobs) else None

        jobs = wait_until(ended, 240, "every job to end", interval=2)
        names = [j["name"] for j in jobs]
        assert len(names) == len(set(names)), "a submit became two jobs"
        assert {j["id"] for j in jobs} >= set(acked.values()), "an answered submit is missing"
        assert len(jobs) == len(acked)
        failed = [(j["name"], j["state"], j["reason"]) for j in jobs if j["state"] != "SUCCEEDED"]
        assert failed == [], failed
        check = subprocess.run([sys.executable, "-m", "broker.cli.main", "db", "check",
                                "--db", db_url], cwd=ROOT, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        a.kill()
        b.kill()


def _all_jobs(server: Server) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": "500", **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{server.url}/v1/jobs", params=params, timeout=30).json()
        out.extend(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return out
