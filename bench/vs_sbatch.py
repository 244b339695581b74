"""Benchmark: submit-to-RUNNING latency through isbatch vs direct sbatch, on the real cluster.

Needs the local cluster (deploy/testenv/slurm/up). Starts an `isthmus server` (SQLite, the
cluster's partitions as pools, a slurm_compat section, the default control intervals, so the
runtime's wakes after a submit and a dispatch drive the loop as in production) and, in one run,
alternates N submissions of the same one-node script: `isbatch` (the console script, as a user
runs it: interpreter start, mapping, API call) and `sbatch` to the same partition. Each latency
runs from just before the command starts to the first poll (every 50 ms) that sees the job
running: Isthmus state RUNNING for isbatch, squeue state R for sbatch.

    .venv/bin/python -m bench.vs_sbatch [--jobs 50]

Last line: ``vs-sbatch: isbatch p50 <A> ms sbatch p50 <B> ms extra p50 <C> ms``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "deploy" / "testenv" / "slurm" / "up"
POLL_S = 0.05
SCRIPT = """#!/bin/bash
#SBATCH -J vs-sbatch
#SBATCH -p a100
#SBATCH -N 1
#SBATCH --gres=gpu:a100:1
#SBATCH -t 5
#SBATCH -A isthmus
#SBATCH -o /dev/null
sleep 4
"""


def cluster() -> dict[str, str]:
    out = subprocess.run([str(UP)], capture_output=True, text=True, check=True,
                         timeout=900).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, values: dict[str, str], work: Path) -> None:
    cap = {"nodes": 3, "gpus_per_node": 8}
    data = {
        "auth": {"mode": "none"},
        "control": {"lease_ttl": 3.0},  # the default intervals: the runtime's wakes drive it
        "flavors": [{"name": "a100-80g", "gpu_model": "A100", "gpu_memory_gb": 80},
                    {"name": "h100-80g", "gpu_model": "H100", "gpu_memory_gb": 80}],
        "backends": [{"name": "slurm-local", "kind": "slurm",
                      "settings": {"transport": "cli", "slurm_conf": values["SLURM_CONF"],
                                   "work_dir": str(work)}}],
        "pools": [{"name": f"slurm-{p}", "backend": "slurm-local", "partition": p,
                   "flavor": f"{p}-80g", "capacity": cap} for p in ("a100", "h100")],
        "teams": [{"name": "bench", "quotas": {"a100-80g": {"nominal": 1000},
                                               "h100-80g": {"nominal": 1000}}}],
        "slurm_compat": {"partitions": {"a100": {"flavors": ["a100-80g"], "backend": "slurm"}},
                         "accounts": {"isthmus": "bench"}, "gpu_types": {"a100": "a100-80g"}},
    }
    path.write_text(yaml.safe_dump(data))


def wait(pred: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not start")
        time.sleep(POLL_S)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    args = ap.parse_args()
    values = cluster()
    slurm_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    slurm_env["SLURM_CONF"] = values["SLURM_CONF"]
    with tempfile.TemporaryDirectory(prefix="vs-sbatch-") as tmp_name:
        tmp = Path(tmp_name)
        work = tmp / "jobs"
        work.mkdir()
        work.chmod(0o777)
        write_config(tmp / "isthmus.yaml", values, work)
        script = tmp / "job.sh"
        script.write_text(SCRIPT)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "broker.cli.main", "server", "--config",
             str(tmp / "isthmus.yaml"), "--db", f"sqlite:///{tmp / 'isthmus.db'}",
             "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        http = httpx.Client(base_url=url, timeout=10)
        isbatch = [str(ROOT / ".venv" / "bin" / "isbatch"), "--parsable", str(script)]
        user_env = {**slurm_env, "ISTHMUS_URL": url, "HOME": str(tmp)}
        ours: list[float] = []
        theirs: list[float] = []
        command: list[float] = []
        phases: list[dict[str, float]] = []
        try:
            wait(lambda: _up(http), 60)
            for _ in range(args.jobs):
                t0 = time.monotonic()
                job_id = subprocess.run(isbatch, capture_output=True, text=True, check=True,
                                        env=user_env, cwd=tmp, timeout=60).stdout.strip()
                command.append((time.monotonic() - t0) * 1000)
                wait(lambda j=job_id: http.get(f"/v1/jobs/{j}").json()["state"] == "RUNNING")
                ours.append((time.monotonic() - t0) * 1000)
                phases.append(_phases(http, job_id))

                t0 = time.monotonic()
                slurm_id = subprocess.run(["sbatch", "--parsable", str(script)],
                                          capture_output=True, text=True, check=True,
                                          env=slurm_env, cwd=tmp, timeout=60).stdout.strip()
                wait(lambda j=slurm_id: subprocess.run(
                    ["squeue", "-h", "-j", j, "-o", "%t"], capture_output=True,
                    text=True, env=slurm_env, check=False).stdout.strip() == "R")
                theirs.append((time.monotonic() - t0) * 1000)
            _timeline(http, job_id)
        finally:
            http.close()
            server.terminate()
            server.wait(timeout=30)
            log.close()
    a, b = statistics.median(ours), statistics.median(theirs)
    q = statistics.quantiles
    print(f"isbatch p90 {q(ours, n=10)[-1]:.0f} ms, sbatch p90 {q(theirs, n=10)[-1]:.0f} ms "
          f"({args.jobs} jobs each)")
    print(f"the isbatch command alone (start to exit): p50 {statistics.median(command):.0f} ms, "
          f"p90 {q(command, n=10)[-1]:.0f} ms")
    print("broker phases, p50 ms after the submission was stored: " + " ".join(
        f"{k}+{statistics.median(p[k] for p in phases if k in p):.0f}"
        for k in ("ADMITTED", "PREPARING", "RUNNING")))
    print(f"vs-sbatch: isbatch p50 {a:.0f} ms sbatch p50 {b:.0f} ms extra p50 {a - b:.0f} ms")


def _timeline(http: httpx.Client, job_id: str) -> None:
    """Where the last isbatch job's time went, from its event history."""
    events = http.get(f"/v1/jobs/{job_id}/events").json()
    t0 = datetime.fromisoformat(events[0]["at"])
    steps = [f"{e['to_state']}+{(datetime.fromisoformat(e['at']) - t0).total_seconds() * 1000:.0f}"
             for e in events]
    print("last isbatch job, ms after submission: " + " ".join(steps))


def _phases(http: httpx.Client, job_id: str) -> dict[str, float]:
    """ms from the job's first event (stored) to its first event in each later state."""
    events = http.get(f"/v1/jobs/{job_id}/events").json()
    t0 = datetime.fromisoformat(events[0]["at"])
    out: dict[str, float] = {}
    for e in events:
        out.setdefault(e["to_state"],
                       (datetime.fromisoformat(e["at"]) - t0).total_seconds() * 1000)
    return out


def _up(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
