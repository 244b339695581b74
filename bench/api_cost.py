"""Server CPU per request of one API replica, by kind of request (issue 27; not a timed test).

The soak's p99 is set by the CPU of its processes: this says where an API replica's goes.
Starts a throwaway PostgreSQL (or uses `--db`) and one `isthmus server --no-control` with the
soak's configuration (bench/soak.py: the simulated federation, four teams, each calling with its
own token, as in the soak).
Then, closed loop with `--concurrency` keep-alive connections, in turn: `--requests` submits
(the soak's specs), health checks (`GET /healthz`: the framework's floor, one trivial read),
job reads, explains, a quarter as many list pages (`?team=&limit=50`) and a tenth as many
cancels. For each kind, the server process's CPU (user + system, from /proc) over the phase
divided by its requests. Last line:
`api-cost: submit <a> healthz <b> read <c> explain <d> list <e> cancel <f> ms/request`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.soak import (
    TEAMS,
    Conns,
    Postgres,
    Replica,
    _wait_healthy,
    as_team,
    spec,
    write_config,
)

Request = tuple[str, str, Any, dict[str, str]]


async def _phase(conns: Conns, make: Callable[[int], Request], n: int, concurrency: int,
                 ids: list[tuple[str, str]]) -> list[float]:
    """`n` requests made by `make`, `concurrency` at a time; their latencies (s). The jobs
    submitted are added to `ids` (id, team)."""
    todo = list(range(n))
    latencies: list[float] = []

    async def worker() -> None:
        while todo:
            i = todo.pop()
            method, path, body, headers = make(i)
            t0 = time.perf_counter()
            answer = await conns.request(method, path,
                                         json.dumps(body).encode() if body is not None else None,
                                         headers)
            latencies.append(time.perf_counter() - t0)
            if answer.status >= 300:
                raise RuntimeError(f"{method} {path}: {answer.status} {answer.json()}")
            if method == "POST" and path == "/v1/jobs":
                job = answer.json()
                ids.append((job["id"], job["team"]))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def _run(replica: Replica, n: int, concurrency: int, seed: int) -> dict[str, float]:
    conns = Conns(replica.port, concurrency)
    rng = random.Random(seed)
    ids: list[tuple[str, str]] = []

    def submit(prefix: str) -> Callable[[int], Request]:
        def make(i: int) -> Request:
            name = f"{prefix}-{i:07d}"
            team = TEAMS[i % 4]
            return ("POST", "/v1/jobs", spec(name, team, rng),
                    {"Idempotency-Key": name, **as_team(team)})
        return make

    def job_call(method: str, job: tuple[str, str], tail: str) -> Request:
        return method, f"/v1/jobs/{job[0]}{tail}", None, as_team(job[1])

    kinds: list[tuple[str, Callable[[int], Request], int]] = [
        ("submit", submit("cost"), n),
        ("healthz", lambda i: ("GET", "/healthz", None, {}), n),
        ("read", lambda i: job_call("GET", ids[i % len(ids)], ""), n),
        ("explain", lambda i: job_call("GET", ids[i % len(ids)], "/explain"), n),
        ("list", lambda i: ("GET", f"/v1/jobs?team={TEAMS[i % 4]}&limit=50", None,
                            as_team(TEAMS[i % 4])),
         max(1, n // 4)),
        ("cancel", lambda i: job_call("POST", ids[i], "/cancel"), max(1, n // 10)),
    ]
    await _phase(conns, submit("warm"), 50, concurrency, ids)  # connections, caches, JIT-free
    out: dict[str, float] = {}
    for name, make, count in kinds:
        cpu0, wall0 = replica.cpu_s(), time.perf_counter()
        latencies = sorted(await _phase(conns, make, count, concurrency, ids))
        cpu, wall = replica.cpu_s() - cpu0, time.perf_counter() - wall0
        out[name] = cpu / count * 1000
        print(f"{name:8s} {count:6d} requests: server CPU {out[name]:6.2f} ms/request, "
              f"{count / wall:5.0f} requests/s, p50 {latencies[len(latencies) // 2] * 1000:.1f} "
              f"ms, p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000,
                    help="submits, health checks, reads and explains each (default 2000)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--db", default=None, help="a PostgreSQL URL (default: a throwaway server)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="isthmus-api-cost-"))
    pg = None if args.db else Postgres()
    db = args.db or (pg.url if pg else "")
    replica = Replica("api", write_config(work, 100, work / "no.outage"), db, work, role="api")
    try:
        replica.start()
        _wait_healthy(replica)
        out = asyncio.run(_run(replica, args.requests, args.concurrency, args.seed))
    finally:
        replica.kill(signal.SIGTERM)
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("api-cost: " + " ".join(f"{k} {v:.2f}" for k, v in out.items()) + " ms/request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
