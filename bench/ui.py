"""Dashboard pages at scale (issue 15 benchmark; not a timed test).

A database holding 10,000 jobs (3,000 waiting with their stored verdicts and positions, 500
running, the rest ended with their ledger usage and waste over 30 days), 100,000 events,
5,000 admission cycles and 20,000 logged decisions; the app of `isthmus server` on it with the
simulated federation of examples/isthmus.yaml (its inventories taken once). Each page is asked
for `--repeat` times in process (no network) as an admin, who sees every team. The server
time of a page is the Server-Timing the app itself adds (broker/ui/timing.py: from the
request entering the app to the page's headers, the page rendered); the time the test client
waited and the process's CPU time are printed next to it, with the load average. Prints
`ui: <page> p95 <T> ms` (server time) per page last. Goal: every page < 300 ms.

  PYTHONPATH=. .venv/bin/python bench/ui.py [--postgres | --db URL] [--repeat 30]
      [--profile PAGE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker.config import load_config
from broker.control.plane import ControlPlane
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from broker.store import daily_sums, open_database
from broker.store.attempts import ATTEMPTS, CYCLES, EXPLANATIONS
from broker.store.decision_log import DECISIONS
from broker.store.records import EVENTS, JOBS
from broker.store.tables import LEDGER_ENTRIES as LEDGER
from broker.web import build_app
from broker.wiring.runtime import build_backends, control_params

ROOT = Path(__file__).resolve().parents[1]
TEAMS = ("vision", "language")
POOLS = (("slurm-h100", "h100-80g", "sim-slurm"), ("slurm-a100", "a100-80g", "sim-slurm"),
         ("k8s-h100", "h100-80g", "sim-k8s"), ("k8s-a100", "a100-80g", "sim-k8s"))
EVENTS_PER_JOB = 10
STATES = ("SUBMITTED", "VALIDATING", "QUEUED", "ADMITTED", "PREPARING", "RUNNING")


def _spec(i: int, team: str) -> tuple[str, str]:
    spec = JobSpec.model_validate({
        "name": f"train-{i}", "team": team, "gang": {"replicas": 1 + i % 4, "gpus_per_replica": 8},
        "flavors": ["h100-80g", "a100-80g"], "max_runtime": "4h",
        "entrypoint": {"image": "registry.local/train:1.0", "command": ["python", "train.py"]},
        "annotations": {"isthmus.io/sim-duration": "30m"},
    })
    return spec.canonical_json(), spec.spec_hash()


def _verdict(job_id: str, position: int, now: datetime) -> str:
    pools = [{"pool": p, "flavor": f, "backend": b, "backend_kind": b[4:], "fits": False,
              "reason": "InsufficientCapacity", "severity": 30, "score": None, "level": None,
              "domain": None, "queued": False,
              "message": f"{p}: needs 16 GPUs in one rack; 8 of 32 free"} for p, f, b in POOLS]
    return json.dumps({
        "job_id": job_id, "admitted": False, "reason": "InsufficientCapacity",
        "most_severe": "InsufficientCapacity", "message": pools[0]["message"],
        "placement": None, "pools": pools, "victims": [], "reservation": None,
        "position": position, "team_position": (position + 1) // 2,
        "estimated_start": (now + timedelta(minutes=position)).isoformat(),
        "estimate_method": "releases",
    })


def seed(db: Any, jobs: int, rng: random.Random) -> dict[str, str]:
    """Bulk rows through Core; returns a sample of job ids by kind."""
    now = datetime.now(UTC)
    t0 = now - timedelta(days=30)
    job_rows, event_rows, attempt_rows, verdicts, ledger = [], [], [], [], []
    sample: dict[str, str] = {}
    queued = 0
    for i in range(jobs):
        created = t0 + timedelta(seconds=i * (30 * 86400 / jobs))
        jid = new_job_id(created.timestamp())
        team = TEAMS[i % 2]
        spec_json, spec_hash = _spec(i, team)  # every job its own spec, as in life
        kind = "queued" if i % 10 < 3 else "running" if i % 20 == 3 else "ended"
        state = {"queued": "QUEUED", "running": "RUNNING"}.get(
            kind, rng.choice(("SUCCEEDED",) * 6 + ("FAILED", "CANCELLED")))
        gpus = 8 * (1 + i % 4)
        pool, flavor, backend = POOLS[i % 4]
        job_rows.append({
            "id": jid, "name": f"train-{i}", "team": team, "queue": "default",
            "priority": "normal", "state": state, "reason": {"QUEUED": "InsufficientCapacity",
            "RUNNING": "Running", "SUCCEEDED": "Succeeded", "FAILED": "UserError",
            "CANCELLED": "CancelledByUser"}[state], "message": "", "attempt": 0 if kind ==
            "queued" else 1, "last_seq": EVENTS_PER_JOB, "total_gpus": gpus,
            "spec_json": spec_json, "spec_hash": spec_hash, "idempotency_key": None,
            "submitted_by": f"user{i % 17}", "created_at": created, "updated_at": created,
            "first_useful_work_at": None, "not_before": None, "exclude_json": "{}",
        })
        for seq in range(1, EVENTS_PER_JOB + 1):
            to = state if seq == EVENTS_PER_JOB else STATES[min(seq - 1, len(STATES) - 1)]
            event_rows.append({
                "job_id": jid, "seq": seq, "at": created + timedelta(seconds=seq),
                "from_state": None if seq == 1 else STATES[min(seq - 2, len(STATES) - 1)],
                "to_state": to, "reason": "Running", "message": f"event {seq} of job {i}",
                "cause_kind": "bench", "cause_key": f"b{seq}", "actor": "system:bench",
                "attempt": 0 if kind == "queued" else 1, "facts_ref": None,
                "details_json": None,
            })
        if kind == "queued":
            queued += 1
            verdicts.append({"job_id": jid, "at": now, "payload_json": _verdict(jid, queued, now)})
            sample.setdefault("queued", jid)
            continue
        ended = None if kind == "running" else created + timedelta(hours=2)
        attempt_rows.append({
            "job_id": jid, "number": 1, "snapshot_json": spec_json, "spec_hash": spec_hash,
            "backend_name": f"isthmus-{jid}-1", "created_at": created, "ended_at": ended,
            "backend": backend, "pool": pool, "flavor": flavor, "gpus": gpus,
            "dispatch": "created", "phase": "RUNNING" if ended is None else "SUCCEEDED",
            "preempted": False, "started_at": created + timedelta(seconds=5),
            "rendered": "#!/bin/bash\n#SBATCH --nodes=1\nsrun python train.py\n",
        })
        sample.setdefault(kind, jid)
        if ended is not None:
            hours = gpus * 2.0
            ledger.append({"job_id": jid, "attempt": 1, "kind": "usage", "team": team,
                           "flavor": flavor, "gpus": gpus, "borrowed_gpus": 0,
                           "gpu_hours": hours, "at": ended, "note": "", "cost": hours * 1.5,
                           "pool": pool, "submitted_by": f"user{i % 17}"})
            if state != "SUCCEEDED":
                ledger.append({"job_id": jid, "attempt": 1, "team": team, "flavor": flavor,
                               "kind": "waste:failed" if state == "FAILED" else
                               "waste:cancelled", "gpus": gpus, "borrowed_gpus": 0,
                               "gpu_hours": hours / 2, "at": ended, "note": "",
                               "cost": hours * 0.75, "pool": pool,
                               "submitted_by": f"user{i % 17}"})
    cycles, decisions = [], []
    ids = [r["id"] for r in job_rows]
    for c in range(1, 5_001):
        record = {"pending": 3000, "admitted": 1, "waiting": 2999,
                  "reasons": [["InsufficientCapacity", 2999]],
                  "admitted_to": [[ids[c % len(ids)], POOLS[c % 4][0]]],
                  "reservations": [], "victims": []}
        cycles.append({"id": c, "at": t0 + timedelta(minutes=8 * c), "leader_epoch": 1,
                       "inputs_digest": f"{c:016x}", "record_json": json.dumps(record)})
        for k in range(4):
            jid = ids[(c * 4 + k) % len(ids)]
            decisions.append({"cycle_id": c, "job_id": jid, "team": TEAMS[0], "admitted": False,
                              "reason": "InsufficientCapacity", "digest": f"{c:08x}{k:08x}",
                              "payload_json": json.dumps({
                                  "admitted": False, "message": "needs 16 GPUs", "pools": [
                                      {"pool": p, "fits": False, "reason": "InsufficientCapacity",
                                       "message": "8 of 32 free"} for p, _, _ in POOLS],
                                  "reason": "InsufficientCapacity", "victims": []})})
    with db.write() as s:
        conn = s.connection()
        for table, rows in ((JOBS, job_rows), (EVENTS, event_rows), (ATTEMPTS, attempt_rows),
                            (EXPLANATIONS, verdicts), (LEDGER, ledger), (CYCLES, cycles),
                            (DECISIONS, decisions)):
            for start in range(0, len(rows), 2000):
                conn.execute(sa.insert(table), rows[start:start + 2000])
        daily_sums.add_entries(s, sa.true())  # the bulk-loaded entries' day sums
    print(f"seeded {len(job_rows)} jobs, {len(event_rows)} events, {len(attempt_rows)} "
          f"attempts, {len(ledger)} ledger entries, {len(cycles)} cycles, "
          f"{len(decisions)} decisions")
    return sample


def pages(sample: dict[str, str]) -> dict[str, str]:
    return {
        "overview": "/ui",
        "queue": "/ui/queue",
        "queue-page-50": "/ui/queue?page=50",
        "jobs": "/ui/jobs",
        "jobs-failed": "/ui/jobs?state=FAILED",
        "job-queued": f"/ui/jobs/{sample['queued']}",
        "job-ended": f"/ui/jobs/{sample['ended']}",
        "logs": f"/ui/jobs/{sample['running']}/logs",
        "decisions": "/ui/decisions",
        "reports-day": "/ui/reports?range=day",
        "reports-month": "/ui/reports?range=month",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--db", default=None, help="database URL (default: a temporary SQLite)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--profile", metavar="PAGE", default=None,
                    help="time only this page, profiled (slower): its top functions, its SQL")
    ap.add_argument("--postgres", action="store_true",
                    help="start a throw-away PostgreSQL server (as bench/submit.py does)")
    args = ap.parse_args()
    server = None
    if args.postgres:
        from bench.submit import Postgres

        server = Postgres()
    try:
        run(args, server.url if server else args.db)
    finally:
        if server is not None:
            server.stop()


def _server_ms(response: Any) -> float:
    """The page's server time from its Server-Timing header (broker/ui/timing.py)."""
    value = response.headers["server-timing"]
    return float(value.split("dur=")[1].split(";")[0].split(",")[0])


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class _Profiled:
    """In --profile mode: the app's sync handlers run inline on the event loop's thread
    (instead of its thread pool), and each request runs under cProfile there; every SQL
    statement is timed."""

    def __init__(self, app: Any, db: Any) -> None:
        import cProfile

        import fastapi.dependencies.utils
        import fastapi.routing

        async def inline(func: Any, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

        fastapi.routing.run_in_threadpool = inline  # type: ignore[assignment]
        fastapi.dependencies.utils.run_in_threadpool = inline  # type: ignore[assignment]
        self.app, self.prof = app, cProfile.Profile()
        self.sql: dict[str, list[float]] = {}
        for engine in {db.writer, db.reader}:
            sa.event.listen(engine, "before_cursor_execute", self._before)
            sa.event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, stmt: str, *_: Any) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, stmt: str, *_: Any) -> None:
        took = (time.perf_counter() - conn.info.pop("bench_t0")) * 1000
        self.sql.setdefault(" ".join(stmt.split())[:160], []).append(took)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.prof.enable()
        try:
            await self.app(scope, receive, send)
        finally:
            self.prof.disable()

    def report(self, requests: int) -> None:
        import pstats

        pstats.Stats(self.prof).sort_stats("cumulative").print_stats(40)
        print(f"SQL per request (of {requests}): count, ms, statement")
        for stmt, times in sorted(self.sql.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {len(times) / requests:5.1f} {sum(times) / requests:7.2f}  {stmt}")


def run(args: argparse.Namespace, db_url: str | None) -> None:
    url = db_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'ui.db'}"
    db = open_database(url, sqlite_synchronous="NORMAL")
    config = load_config(ROOT / "examples" / "isthmus.yaml")
    sample = seed(db, args.jobs, random.Random(1))
    plane = ControlPlane(db, config, build_backends(config), params=control_params(config))
    plane.inventory()  # the overview shows the last inventories, as a leading server does
    app: Any = build_app(config, db, SimpleNamespace(plane=plane))  # type: ignore[arg-type]
    if args.profile:
        app = profiled = _Profiled(app, db)
    results = []
    with TestClient(app) as client:
        for name, path in pages(sample).items():
            if args.profile and name != args.profile:
                continue
            server, wall, cpu = [], [], []
            for i in range(args.repeat + 2):
                t, c = time.perf_counter(), time.process_time()
                r = client.get(path)
                took, used = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
                if i >= 2:  # two warm-up requests
                    server.append(_server_ms(r))
                    wall.append(took)
                    cpu.append(used)
            results.append((name, _p95(server), statistics.median(server), _p95(wall),
                            statistics.median(cpu), len(r.content)))
            if args.profile:
                profiled.report(args.repeat + 2)
    # server: the page's time inside the app (Server-Timing, from the request entering the
    # app to its headers); wall: what this client waited (the test client's thread hops
    # added); CPU: this process's CPU time per request (client included), whatever else the
    # machine runs. On a loaded machine server time includes waiting for a core.
    load = os.getloadavg()
    print(f"  load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} cores")
    for name, _, p50, wall95, cpu50, size in results:
        print(f"  {name:<14} server p50 {p50:6.1f} ms  wall p95 {wall95:6.1f} ms  "
              f"cpu p50 {cpu50:6.1f} ms  {size // 1024:4d} KiB")
    for name, p95, _, _, _, _ in results:
        print(f"ui: {name} p95 {p95:.1f} ms")


if __name__ == "__main__":
    main()
