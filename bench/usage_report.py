"""Usage report over a large ledger on PostgreSQL (issue 15 benchmark; not a timed test).

Starts a throwaway PostgreSQL server (as bench/submit.py does), migrates it, and loads with COPY
a synthetic history: jobs of 50 teams of 10 users, two attempts each over 8 pools of 4
flavors across 90 days, and their ledger entries (reserve, release, usage and one or two
waste kinds per attempt) until the ledger holds N rows (default 1,000,000); one attempt in a
hundred is booked as before revisions 0007 and 0010 (no cost, pool or user on its entries, so
the report looks them up), and adds their sums per day (broker.store.daily_sums.add_entries,
as every bulk load must). Then VACUUM ANALYZE, as autovacuum does on an append-only table.
Then it times
`broker.views.usage.read_usage` (the query behind GET /v1/reports/usage) by team, pool,
flavor and user, over the whole history and over a 30-day window, R runs each, and checks
that every report's total equals the ledger's sum.

Prints one line per report and last `usage_report: <rows> rows worst p50 <T> ms max <T> ms`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

import psycopg
import sqlalchemy as sa

from bench.submit import Postgres
from broker.store import daily_sums, open_database
from broker.views.usage import read_usage

START = datetime(2026, 9, 1, tzinfo=UTC)
FLAVORS = [("h100-80g", 2.0), ("a100-80g", 1.0), ("l40s-48g", 0.6), ("h200-141g", 2.5)]
POOLS = [(f"pool-{i}", FLAVORS[i % 4][0], 1.0 + 0.25 * (i % 3)) for i in range(8)]
ENDINGS: list[str | None] = ["waste:failed", "waste:lost", "waste:preempted",
                             "waste:cancelled", None, None]


def _user(job: int) -> str:
    """Ten users per team: job j is team-(j % 50)'s."""
    return f"user-{job % 50}-{(job // 50) % 10}"


def _load(url: str, rows: int, seed: int) -> tuple[int, float]:
    """Fill jobs, attempts and ledger_entries; (ledger rows, usage GPU-hours) written."""
    rng = random.Random(seed)
    per_attempt = 4.6  # reserve, release, usage, preparing, and 2 in 3 times one more kind
    attempts = int(rows / per_attempt) + 1000
    jobs = (attempts + 1) // 2
    written, usage_hours = 0, 0.0
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            with cur.copy("COPY jobs (id, name, team, queue, priority, state, reason, message,"
                          " attempt, last_seq, total_gpus, spec_json, spec_hash, submitted_by,"
                          " created_at, updated_at, exclude_json) FROM STDIN") as copy:
                for j in range(jobs):
                    at = START + timedelta(seconds=rng.randrange(90 * 86400))
                    copy.write_row((f"J{j:015d}", "bench", f"team-{j % 50}", "default",
                                    "normal", "SUCCEEDED", "Succeeded", "", 2, 1, 8, "{}",
                                    "x" * 64, _user(j), at, at, "{}"))
            made = []
            for a in range(attempts):
                pool, flavor, pool_weight = POOLS[rng.randrange(len(POOLS))]
                begin = START + timedelta(seconds=rng.randrange(90 * 86400))
                made.append((f"J{a // 2:015d}", a % 2 + 1, pool, flavor,
                             dict(FLAVORS)[flavor] * pool_weight, f"team-{(a // 2) % 50}",
                             rng.choice((8, 16, 32, 64)), begin,
                             begin + timedelta(seconds=rng.randrange(600, 86400)),
                             rng.choice(ENDINGS)))
            with cur.copy("COPY attempts (job_id, number, snapshot_json, spec_hash,"
                          " backend_name, created_at, ended_at, backend, pool, flavor, gpus,"
                          " dispatch, phase, preempted) FROM STDIN") as copy:
                for i, (job, number, pool, flavor, _, _, gpus, begin, end, _) in enumerate(made):
                    copy.write_row((job, number, "{}", "x" * 64, f"isthmus-{i}", begin, end,
                                    "sim", pool, flavor, gpus, "created", "SUCCEEDED", False))
            with cur.copy("COPY ledger_entries (job_id, attempt, kind, team, flavor, gpus,"
                          " borrowed_gpus, gpu_hours, at, note, cost, pool, submitted_by)"
                          " FROM STDIN") as copy:
                for i, (job, number, pool, flavor, weight, team, gpus, begin, end,
                        ending) in enumerate(made):
                    legacy = i % 100 == 0  # booked before 0007/0010: no cost, pool, user
                    hours = gpus * (end - begin).total_seconds() / 3600
                    entries = [("reserve", 0.0, None), ("release", 0.0, None),
                               ("usage", hours, hours * weight),
                               ("waste:preparing", hours * 0.05, hours * 0.05 * weight)]
                    if ending is not None:
                        entries.append((ending, hours * 0.3, hours * 0.3 * weight))
                    for kind, h, cost in entries[:rows - written]:
                        known = kind not in ("reserve", "release") and not legacy
                        copy.write_row((job, number, kind, team, flavor, gpus, 0, h, end, "",
                                        cost if not legacy else None,
                                        pool if known else None,
                                        _user(i // 2) if known else None))
                        written += 1
                        usage_hours += h if kind == "usage" else 0.0
                    if written >= rows:
                        break
        conn.commit()
    return written, usage_hours


def _time(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=15)
    args = ap.parse_args()
    pg = Postgres()
    try:
        db = open_database(pg.url)  # migrates
        t0 = time.perf_counter()
        rows, hours = _load(pg.url, args.rows, args.seed)
        with db.write() as s:  # COPY bypasses the application: the load adds its day sums
            daily_sums.add_entries(s, sa.true())
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # what autovacuum does to an append-only table
        print(f"  loaded {rows} ledger rows in {time.perf_counter() - t0:.0f} s")
        worst_p50, worst_max = 0.0, 0.0
        windows = {"all": (None, None),
                   "30d": (START + timedelta(days=30), START + timedelta(days=60))}
        for by in ("team", "pool", "flavor", "user"):
            for label, (t_from, t_to) in windows.items():
                report = read_usage(db, by, t_from, t_to)  # warm-up, and the check below
                if label == "all" and abs(report.total.gpu_hours - hours) > 1e-6 * hours:
                    raise SystemExit(f"by {by}: total {report.total.gpu_hours} != {hours}")
                times = _time(lambda b=by, f=t_from, t=t_to: read_usage(db, b, f, t), args.runs)
                p50, top = statistics.median(times), max(times)
                worst_p50, worst_max = max(worst_p50, p50), max(worst_max, top)
                print(f"  by={by} window={label}: {len(report.lines)} lines, p50 {p50:.0f} ms "
                      f"max {top:.0f} ms")
        db.dispose()
        print(f"usage_report: {rows} rows worst p50 {worst_p50:.0f} ms max {worst_max:.0f} ms")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
