"""Benchmark: one full Slurm observe cycle with 1,000 Isthmus jobs in the real queue.

Needs the local cluster (deploy/testenv/slurm/up). Submits N held jobs (they stay PENDING and use
no nodes), times SlurmBackend.observe(names) per transport (one queue call for all jobs; a second
variant also expects a few departed names, which adds one accounting call), then cancels them.

    .venv/bin/python -m bench.slurm_observe [--jobs 1000] [--repeat 5]

Ends with one line per transport (median): ``slurm_observe: <transport> <N> jobs <T> ms``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from backends.slurm import SlurmBackend
from broker.config import Backend, Pool
from broker.domain.attempts import backend_object_name
from broker.domain.ids import new_job_id
from broker.wiring.adapters import slurm_adapter

STATE = Path(os.environ.get("ISTHMUS_SLURM_STATE", "/tmp/isthmus-slurm"))


def cluster_env() -> dict[str, str]:
    values = {}
    for line in (STATE / "env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    return values


def make(values: dict[str, str], transport: str) -> SlurmBackend:
    settings: dict[str, object] = {"transport": transport, "work_dir": str(STATE / "work")}
    if transport == "cli":
        settings["slurm_conf"] = values["SLURM_CONF"]
    else:
        settings.update(rest_url=values["SLURMRESTD_URL"], rest_user=values["SLURM_JWT_USER"],
                        rest_token=values["SLURM_JWT"])
    pools = [Pool(name=f"slurm-{p}", backend="slurm-local", partition=p, flavor=f"{p}-80g")
             for p in values["SLURM_PARTITIONS"].split(",")]
    return slurm_adapter(Backend(name="slurm-local", kind="slurm", settings=settings), pools)


def submit_held(values: dict[str, str], names: list[str]) -> list[str]:
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": values["SLURM_CONF"]}

    def one(name: str) -> str:
        proc = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-J", name, "-p", "h100", "-N", "1",
             "--gres=gpu:h100:8", "-o", "/dev/null", "--wrap", "true"],
            capture_output=True, text=True, env=env, timeout=60, check=True,
            cwd=str(STATE / "work"),
        )
        return proc.stdout.strip().split(";")[0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, names))


def cancel(values: dict[str, str], ids: list[str]) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": values["SLURM_CONF"]}
    for i in range(0, len(ids), 200):
        subprocess.run(["scancel", *ids[i : i + 200]], env=env, timeout=120, check=False)


def timed(backend: SlurmBackend, names: list[str], repeat: int) -> tuple[float, int]:
    backend.observe(names)  # warm-up (version detection, connections)
    samples, count = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        facts = backend.observe(names)
        samples.append((time.perf_counter() - t0) * 1000)
        count = len(facts)
    return statistics.median(samples), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    values = cluster_env()
    run = new_job_id()[:10]
    names = [backend_object_name(f"{run}{i:06d}", 1) for i in range(args.jobs)]
    departed = [backend_object_name(f"{run}gone{i:02d}", 1) for i in range(10)]
    t0 = time.perf_counter()
    ids = submit_held(values, names)
    print(f"submitted {len(ids)} held jobs in {time.perf_counter() - t0:.1f} s")
    results: list[tuple[str, float]] = []
    try:
        for transport in ("cli", "rest"):
            backend = make(values, transport)
            queue_ms, count = timed(backend, names, args.repeat)
            assert count >= args.jobs, count
            both_ms, _ = timed(backend, names + departed, args.repeat)
            print(f"{transport}: observe {args.jobs} queued: median {queue_ms:.0f} ms; "
                  f"with 10 departed names (+1 accounting call): {both_ms:.0f} ms")
            results.append((transport, queue_ms))
            backend.close()
    finally:
        cancel(values, ids)
    for transport, ms in results:
        print(f"slurm_observe: {transport} {args.jobs} jobs {ms:.0f} ms")


if __name__ == "__main__":
    main()
