"""Control-loop benchmark on the simulated backend (issue 7; not a timed test).

1. 10,000 active jobs: time of one full reconcile pass (observe, compare, persist changes)
   when nothing changed and when ~1% of the jobs changed (finished) since the last pass.
   The setup (submit, admit, dispatch, a first observation) is bench/reconcile_setup.py.
2. Submit -> ADMITTED latency (wall clock) at a steady submission rate, with the admission
   cycle woken by submissions as the server does; goal: p50 under one admission interval.
Last lines: `reconcile: <N> active <T> ms idle <U> ms with changes` and
`admission latency: p50 <A> ms p95 <B> ms (interval <I> ms)`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from backends.sim.backend import SimBackend, SimClock, SimPoolSpec
from bench.reconcile_setup import prepare, rebuild, save
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.plane import ControlPlane
from broker.control.reconcile import ReconcileReport, run_reconcile
from broker.domain.spec import JobSpec
from broker.orchestration.submission import Submission, submit_many
from broker.store import open_database
from broker.store.queries import get_job
from broker.store.records import JOBS

CONFIG = {
    "auth": {"mode": "none"},
    "limits": {"max_replicas": 64},
    "flavors": [{"name": "a100-80g", "gpu_model": "A100", "gpu_memory_gb": 80}],
    "backends": [{"name": "sim", "kind": "slurm",  # runs images, as the sim does
                  "settings": {"container": {"runtime": "pyxis"}}}],
    "pools": [{"name": "big", "backend": "sim", "flavor": "a100-80g"}],
    "teams": [{"name": "t", "quotas": {"a100-80g": {"nominal": 100000}}}],
}


def spec(i: int) -> JobSpec:
    return JobSpec.model_validate({
        "name": f"j{i}", "team": "t", "gang": {"replicas": 1, "gpus_per_replica": 1},
        "flavors": ["a100-80g"], "entrypoint": {"command": ["x"], "image": "i"},
        "env": {"ISTHMUS_SIM_DURATION": str(3600 + (i % 100) * 60)},
    })


def measure(plane: ControlPlane, sim: SimBackend, profile: str | None
            ) -> tuple[list[float], ReconcileReport, float]:
    """Three idle passes, then one after ~1% of the jobs finished: the idle times, the
    report and the time of the pass with changes (cProfile stats to PROFILE.idle and
    PROFILE.reconcile when asked)."""
    idle = []
    for _ in range(3):
        t0 = time.perf_counter()
        run_reconcile(plane, sim.name)
        idle.append(time.perf_counter() - t0)
    if profile:
        cProfile.runctx("run_reconcile(plane, sim.name)", globals(), locals(), f"{profile}.idle")
    sim.clock.advance(3600 + 60)  # ~1% of the jobs finish (durations spread over 100 minutes)
    sim.sync()
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    report = prof.runcall(run_reconcile, plane, sim.name) if prof else run_reconcile(plane,
                                                                                     sim.name)
    t_changes = time.perf_counter() - t0
    if prof:
        prof.dump_stats(f"{profile}.reconcile")
    return idle, report, t_changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--db", default=None, help="database URL (default: a temporary SQLite)")
    ap.add_argument("--rate", type=float, default=20.0, help="submissions/s for part 2")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--dispatch-passes", type=int, default=0,
                    help="dispatch passes in the setup (0: until every intent is dispatched; "
                    "1: the figures before 2026-12-01, when only the first 500 were, so the "
                    "pass observed 500 attempts and each cycle re-read the other intents)")
    ap.add_argument("--profile", default=None,
                    help="write cProfile stats of an idle pass, of the pass with changes and "
                    "of part 2's admission cycles to PREFIX.idle / PREFIX.reconcile / "
                    "PREFIX.admission")
    ap.add_argument("--setup", choices=("bulk", "loop"), default="bulk",
                    help="bulk: the setup's dispatch and first observation through the same "
                    "per-job functions with their writes grouped per 1,000 jobs; loop: "
                    "run_dispatch and run_reconcile as they are (bench/reconcile_setup.py)")
    ap.add_argument("--save-db", default=None,
                    help="after the setup, copy the database (SQLite) to this file")
    ap.add_argument("--from-db", default=None,
                    help="no setup: measure a copy of a database saved by --save-db with the "
                    "same --jobs (migrated to this tree's schema), the simulator rebuilt from it")
    ap.add_argument("--lock", default=None,
                    help="take this file's flock (e.g. /tmp/isthmus-bench.lock) for the "
                    "measured passes only, after the setup")
    args = ap.parse_args()
    url = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.db'}"
    if args.from_db:
        shutil.copyfile(args.from_db, url.removeprefix("sqlite:///"))
    db = open_database(url, sqlite_synchronous="NORMAL")
    config = parse_config(CONFIG)
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    nodes = (args.jobs + 7) // 8 + 50
    sim = SimBackend("sim", "slurm", [SimPoolSpec("big", "a100-80g", blocks=1,
                     racks_per_block=max(1, nodes // 25), nodes_per_rack=25)], clock, seed=1)
    plane = ControlPlane(db, config, {"sim": sim}, clock=lambda: clock.now)

    if args.from_db:
        t0 = time.perf_counter()
        print(f"setup: simulator rebuilt from {args.from_db} with {rebuild(plane, sim)} jobs "
              f"in {time.perf_counter() - t0:.1f}s", end="")
    else:
        times = prepare(plane, config, sim, args.jobs, spec, bulk=args.setup == "bulk",
                        dispatch_passes=args.dispatch_passes)
        print(times.line(args.jobs), end="")
        if args.save_db:
            save(url.removeprefix("sqlite:///"), args.save_db)
    with plane.db.read() as s:
        running = s.connection().execute(
            sa.select(sa.func.count()).select_from(JOBS).where(JOBS.c.state == "RUNNING")
        ).scalar_one()
    print(f"; {running} jobs RUNNING", flush=True)
    with contextlib.ExitStack() as held:
        if args.lock:
            t_wait = time.perf_counter()
            fcntl.flock(held.enter_context(open(args.lock, "a")).fileno(), fcntl.LOCK_EX)
            print(f"lock {args.lock} held after {time.perf_counter() - t_wait:.0f}s wait, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
        idle, report, t_changes = measure(plane, sim, args.profile)
    print(f"reconcile pass with {args.jobs} active: idle {statistics.median(idle) * 1000:.0f} ms;"
          f" with {report.transitions} transitions {t_changes * 1000:.0f} ms"
          f" ({report.observed} attempts observed; idle passes "
          f"{', '.join(f'{t * 1000:.0f}' for t in idle)} ms)")

    # part 2: latency from submit commit to ADMITTED, woken like the server does
    prof = cProfile.Profile() if args.profile else None
    latencies = []
    n = int(args.rate * args.seconds)
    next_cycle = start = time.perf_counter()
    pending: dict[str, float] = {}
    for i in range(n):
        due = i / args.rate
        while time.perf_counter() - start < due:
            time.sleep(0.001)
        t0_sub = time.perf_counter()
        job = submit_many(db, config, [Submission(spec(args.jobs + i), "bench")])[0]
        assert not isinstance(job, Exception)
        pending[job.job.id] = t0_sub
        if time.perf_counter() >= next_cycle:  # the wake-up gap merges bursts
            if prof:
                prof.runcall(run_admission, plane)
            else:
                run_admission(plane)
            next_cycle = time.perf_counter() + min(0.5, args.interval / 4)
            with db.read() as s:
                for jid, t_sub in list(pending.items()):
                    row = get_job(s, jid)
                    if row is not None and row.state == "ADMITTED":
                        latencies.append(time.perf_counter() - t_sub)
                        del pending[jid]
    run_admission(plane)
    with db.read() as s:
        for jid, t_sub in pending.items():
            row = get_job(s, jid)
            if row is not None and row.state == "ADMITTED":
                latencies.append(time.perf_counter() - t_sub)
    if prof:
        prof.dump_stats(f"{args.profile}.admission")
    print(f"reconcile: {args.jobs} active {statistics.median(idle) * 1000:.0f} ms idle "
          f"{t_changes * 1000:.0f} ms with changes")
    if not latencies:
        return  # part 2 skipped (--seconds 0)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p95 = latencies[int(len(latencies) * 0.95)] * 1000
    print(f"admission latency: p50 {p50:.0f} ms p95 {p95:.0f} ms "
          f"(interval {args.interval * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
