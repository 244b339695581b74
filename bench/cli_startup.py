"""Benchmark: how long one `isthmus` or `isqueue` call takes, start to exit, with the server warm.

Starts `isthmus server` on examples/isthmus.yaml (the simulated federation, SQLite, control
loop on), submits examples/jobs/llama-ft.json, waits until an admission cycle has explained it,
then times N runs (default 20) of each of `isthmus list`, `isthmus status ID`,
`isthmus explain ID` and `isqueue` through the console scripts, as a user runs them. Each
command's median is printed; the last line gives the slowest `isthmus` median and `isqueue`'s:

    .venv/bin/python -m bench.cli_startup [--runs 20] [--baseline /path/to/checkout]

With `--baseline DIR` each call alternates with the same call run on another checkout's code
(e.g. main before a change), against the same server, so both see the same machine load.

Last line: ``cli-startup: isthmus <a> s isqueue <b> s`` (goal: both <= 0.25 s on the test
machine, issue 31).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.vs_sbatch import free_port
from broker.client import ApiError, Client, TransportError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "isthmus.yaml"
JOB = ROOT / "examples" / "jobs" / "llama-ft.json"


def _time(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=cwd,
                   timeout=120)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout whose commands are timed alternately")
    args = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(tmp / "server.log", "wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "broker.cli.main", "server", "--config", str(CONFIG),
                 "--db", f"sqlite:///{tmp / 'isthmus.db'}", "--port", str(port)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                job_id = _ready(url)
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                env.update(ISTHMUS_URL=url, HOME=str(tmp), PYTHONPATH=str(ROOT))
                isthmus = str(bin_dir / "isthmus")
                commands = {
                    "isthmus list": [isthmus, "list"],
                    "isthmus status": [isthmus, "status", job_id],
                    "isthmus explain": [isthmus, "explain", job_id],
                    "isqueue": [str(bin_dir / "isqueue")],
                }
                base_env = {**env, "PYTHONPATH": str(args.baseline)} if args.baseline else None
                times: dict[str, list[float]] = {name: [] for name in commands}
                base: dict[str, list[float]] = {name: [] for name in commands}
                for cmd in commands.values():  # one call each first: the server warms up
                    _time(cmd, env, tmp)
                for _ in range(args.runs):  # interleaved: a load spike hits every command
                    for name, cmd in commands.items():
                        times[name].append(_time(cmd, env, tmp))
                        if base_env is not None:
                            base[name].append(_time(cmd, base_env, tmp))
            finally:
                server.terminate()
                server.wait(timeout=30)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        line = f"{name:<16} p50 {medians[name]:.3f} s  max {max(t):.3f} s ({args.runs} runs)"
        if base[name]:
            line += f"; baseline p50 {statistics.median(base[name]):.3f} s"
        print(line)
    slowest = max(v for k, v in medians.items() if k.startswith("isthmus"))
    print(f"cli-startup: isthmus {slowest:.2f} s isqueue {medians['isqueue']:.2f} s")


def _ready(url: str) -> str:
    """Wait for the server, submit the job and wait for its explanation; the job's id."""
    deadline = time.monotonic() + 120
    job_id = None
    while time.monotonic() < deadline:
        try:
            with Client(url) as api:
                if job_id is None:
                    job_id = str(api.submit(json.loads(JOB.read_text()))["id"])
                if api.explain(job_id)["explanation"] is not None:
                    return job_id
        except (TransportError, ApiError):
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not start or never explained the job")


if __name__ == "__main__":
    main()
