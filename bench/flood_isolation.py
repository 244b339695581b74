"""Benchmark: one team's flood must not slow another team's jobs (issue 34).

Runs `isthmus server` on the simulated federation of examples/isthmus.yaml (its own SQLite
database, or `--db`), then, in one run, twice the same thing with only the depth of the other
team's queue changed:
1. quiet: team vision submits `--backlog` jobs (1 x 8 a100-80g GPUs, 1 simulated minute: 6 s of
   wall time), enough to keep every GPU it may take busy while language runs (100 ran out
   before language's last jobs, which then borrowed vision's idle GPUs); then team
   language submits `--jobs` such jobs and the harness waits for them to end;
2. flooded: vision submits `--flood` such jobs (as fast as the API takes them), then language
   submits the same `--jobs` jobs again.
In both, vision holds what its quota and borrowing allow and language gets its own nominal
quota, so the GPUs language can have are the same: what the flood may add is the broker's own
work on a deep queue (holds, views, placement, estimates, the decision log). Each language
job's time from its submit to its end is read from its events. `--flood-flavor h100-80g` puts
the other team's jobs on other GPUs instead (no contention at all).

    .venv/bin/python -m bench.flood_isolation [--flood 2000] [--backlog 300] [--jobs 20]
        [--postgres | --db URL]

Last line: ``flood: quiet <a> s flooded <b> s ratio <b/a>`` (p50 submit-to-end of language's
jobs; goal: ratio <= 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.soak import Postgres
from tests.harness.server import Server

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


def _spec(name: str, team: str, flavor: str) -> dict[str, Any]:
    return {"name": name, "team": team, "flavors": [flavor],
            "gang": {"replicas": 1, "gpus_per_replica": 8},
            "entrypoint": {"command": ["python", "train.py"], "image": "registry.local/t:1"},
            "max_runtime": "10m", "annotations": {"isthmus.io/sim-duration": "1m"}}


def _config(work: Path) -> Path:
    data = yaml.safe_load((ROOT / "examples/isthmus.yaml").read_text())
    for backend in data["backends"]:  # the example's faults are off; no foreign load either
        backend["settings"].pop("foreign_load", None)
    path = work / "isthmus.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _submit(client: httpx.Client, specs: list[dict[str, Any]]) -> list[str]:
    def one(spec: dict[str, Any]) -> str:
        r = client.post("/v1/jobs", json=spec)
        r.raise_for_status()
        return str(r.json()["id"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, specs))


def _ended(client: httpx.Client, ids: list[str], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    left = set(ids)
    while left:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(left)} jobs did not end within {limit_s:.0f} s")
        left = {j for j in left if client.get(f"/v1/jobs/{j}").json()["state"] not in TERMINAL}
        time.sleep(0.5)


def _submit_to_end(client: httpx.Client, job_id: str) -> float:
    events = client.get(f"/v1/jobs/{job_id}/events").json()
    first = datetime.fromisoformat(events[0]["at"])
    last = datetime.fromisoformat(events[-1]["at"])
    assert events[-1]["to_state"] == "SUCCEEDED", events[-1]
    return (last - first).total_seconds()


def _cycles(client: httpx.Client) -> tuple[float, float]:
    """(count, sum) of the admission cycles so far, from the server's metrics."""
    found = {"count": 0.0, "sum": 0.0}
    for line in client.get("/metrics").text.splitlines():
        for key in found:
            if line.startswith(f"isthmus_admission_cycle_seconds_{key} "):
                found[key] = float(line.split()[1])
    return found["count"], found["sum"]


def _team_run(client: httpx.Client, label: str, jobs: int) -> float:
    count0, sum0 = _cycles(client)
    ids = _submit(client, [_spec(f"{label}-{i}", "language", "a100-80g") for i in range(jobs)])
    _ended(client, ids, 900)
    count1, sum1 = _cycles(client)
    took = sorted(_submit_to_end(client, j) for j in ids)
    p50 = statistics.median(took)
    mean = (sum1 - sum0) / max(1.0, count1 - count0)
    print(f"{label}: {jobs} language jobs, submit-to-end p50 {p50:.1f} s max {took[-1]:.1f} s;"
          f" admission cycle mean {mean * 1000:.0f} ms over {count1 - count0:.0f} cycles")
    return p50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--backlog", type=int, default=300)
    ap.add_argument("--flood-flavor", default="a100-80g",
                    help="the other team's flavor (h100-80g: not language's GPUs)")
    ap.add_argument("--db", help="database URL (default: SQLite in a temporary folder)")
    ap.add_argument("--postgres", action="store_true",
                    help="on a private PostgreSQL server started here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flood-") as tmp_name:
        work = Path(tmp_name)
        pg = Postgres() if args.postgres else None
        db = pg.url if pg is not None else args.db or f"sqlite:///{work / 'isthmus.db'}"
        server = Server(_config(work), db, work / "server.log").start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                _submit(client, [_spec(f"backlog-{i}", "vision", args.flood_flavor)
                                 for i in range(args.backlog)])
                quiet = _team_run(client, "quiet", args.jobs)
                started = time.monotonic()
                _submit(client, [_spec(f"flood-{i}", "vision", args.flood_flavor)
                                 for i in range(args.flood)])
                print(f"flood: {args.flood} vision jobs submitted in "
                      f"{time.monotonic() - started:.1f} s")
                flooded = _team_run(client, "flooded", args.jobs)
                queued = client.get("/v1/jobs", params={"team": "vision", "state": "QUEUED",
                                                        "limit": 500}).json().get("items", [])
                print(f"vision jobs still queued at the end: {len(queued)}"
                      f"{'+' if len(queued) == 500 else ''}")
        finally:
            server.stop()
            if pg is not None:
                pg.stop()
    print(f"flood: quiet {quiet:.1f} s flooded {flooded:.1f} s ratio {flooded / quiet:.2f}")


if __name__ == "__main__":
    main()
