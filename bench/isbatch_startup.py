"""Benchmark: how long the `isbatch` command itself takes, start to exit, for one submission.

Starts an `isthmus server --no-control` on examples/isthmus.yaml (SQLite; jobs are stored and
wait) and times N runs of `isbatch --parsable -A vision SCRIPT` through the console script, as a
user runs it. With `--baseline DIR` it alternates with the isbatch of another checkout (e.g. the
main branch before a change), so both are measured in one run on the same machine load.

    .venv/bin/python -m bench.isbatch_startup [--runs 30] [--baseline /path/to/checkout]

Last line: ``isbatch-startup: p50 <A> ms [baseline p50 <B> ms ratio <A/B>]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.vs_sbatch import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "isthmus.yaml"
SCRIPT = """#!/bin/bash
#SBATCH -J startup
#SBATCH -p a100
#SBATCH -N 1
#SBATCH --gres=gpu:a100:1
#SBATCH -t 5
srun true
"""


def _time(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=cwd,
                   timeout=120)
    return (time.monotonic() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout whose isbatch is timed alternately")
    args = ap.parse_args()
    isbatch = str(Path(sys.executable).parent / "isbatch")
    with tempfile.TemporaryDirectory(prefix="isbatch-startup-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "job.sh"
        script.write_text(SCRIPT)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(tmp / "server.log", "wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "broker.cli.main", "server", "--config", str(CONFIG),
                 "--db", f"sqlite:///{tmp / 'isthmus.db'}", "--port", str(port),
                 "--no-control"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                _wait_up(url)
                base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                base.update(ISTHMUS_URL=url, HOME=str(tmp))
                cmd = [isbatch, "--parsable", "-A", "vision", str(script)]
                ours: list[float] = []
                theirs: list[float] = []
                for _ in range(args.runs):
                    ours.append(_time(cmd, {**base, "PYTHONPATH": str(ROOT)}, tmp))
                    if args.baseline is not None:
                        theirs.append(_time(cmd, {**base, "PYTHONPATH": str(args.baseline)},
                                            tmp))
            finally:
                server.terminate()
                server.wait(timeout=30)
    q = statistics.quantiles
    a = statistics.median(ours)
    print(f"this checkout: p50 {a:.0f} ms p90 {q(ours, n=10)[-1]:.0f} ms ({args.runs} runs)")
    line = f"isbatch-startup: p50 {a:.0f} ms"
    if theirs:
        b = statistics.median(theirs)
        print(f"baseline {args.baseline}: p50 {b:.0f} ms p90 {q(theirs, n=10)[-1]:.0f} ms")
        line += f" baseline p50 {b:.0f} ms ratio {a / b:.2f}"
    print(line)


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not start")


if __name__ == "__main__":
    main()
