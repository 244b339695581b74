"""Admission cycle at scale (issue 3 benchmark; not a timed test).

10,000 pending gang jobs (1x1 to 16x8 GPUs) against 5,000 nodes (40,000 GPUs) in 8 pools on
2 backend kinds, 50 teams in 5 cohorts, a partly busy cluster. Runs the full cycle (index
build, quota, ordering, placement, requeue with reasons) several times on one core and prints
`admission: <jobs> jobs <nodes> nodes <R> decisions/s cycle p50 <T> ms` last. `--queues N`
gives each team N queues (weights 1..N; jobs spread over them by a second generator, so the
jobs, inventory and usage are the same for every N) for the team queues' fair sharing;
`--share S` with it gives every queue that share of its team's quota (a cap per flavor).

`--durable`: the cycle carried out on a database (broker.control.admission.run_admission on
the simulated backend): a backlog of `--jobs` queued 1-GPU jobs (default 10,000) admitted in one
cycle with every write (state and events through set_state, ledger reservation, attempt/outbox
row, explanation). Prints `durable admission: <N> admitted in <T> s <R> admissions/s` last;
`--per-job` forces the per-job path (one savepoint per job) for a side-by-side ratio.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from broker.domain.inventory import (
    InventorySnapshot,
    NodeSnapshot,
    PoolSnapshot,
    QueueDepth,
    TopologyPath,
)
from broker.domain.spec import BackendKind
from broker.domain.topology import TopologyLevel
from policies.cycle import admission_cycle
from policies.types import FlavorQuota, PendingJob, QuotaConfig, TeamQuota, Usage

NOW = datetime(2025, 1, 1, 12, tzinfo=UTC)
FLAVORS = ("h100", "a100", "l40s", "h200")
COST = {"h100": 2.0, "a100": 1.0, "l40s": 0.6, "h200": 2.5}


def build_inventory(rng: random.Random, nodes: int, pools: int = 8) -> InventorySnapshot:
    per_pool = nodes // pools
    out = []
    for p in range(pools):
        kind = BackendKind.SLURM if p % 2 == 0 else BackendKind.K8S
        flavor = FLAVORS[(p // 2) % len(FLAVORS)]
        name = f"{kind.value}-{flavor}-{p}"
        snaps = []
        for i in range(per_pool):
            rack, block = i // 16, i // 128
            r = rng.random()
            free = 0 if r < 0.4 else 8 if r < 0.7 else rng.randint(1, 7)
            snaps.append(
                NodeSnapshot(
                    name=f"{name}-n{i:04d}",
                    total_gpus=8,
                    free_gpus=free,
                    topology=TopologyPath(block=f"b{block}", rack=f"r{rack}"),
                    schedulable=rng.random() > 0.01,
                )
            )
        out.append(
            PoolSnapshot(
                name=name,
                backend_kind=kind,
                backend=f"{kind.value}-{p // 4}",
                flavor=flavor,
                cost_weight=COST[flavor],
                shared=kind is BackendKind.SLURM,
                max_isthmus_pending=8,
                nodes=tuple(snaps),
                queue=QueueDepth(foreign_pending_gpus=rng.randint(0, 400)),
            )
        )
    return InventorySnapshot(taken_at=NOW, pools=tuple(out))


def build_quotas(teams: int, cohorts: int) -> QuotaConfig:
    out = {}
    for t in range(teams):
        name = f"team{t:02d}"
        fl = (FLAVORS[t % 4], FLAVORS[(t + 1) % 4])
        out[name] = TeamQuota(
            name,
            f"cohort{t % cohorts}",
            {f: FlavorQuota(nominal=320, borrowing_limit=320, lending_limit=240) for f in fl},
        )
    return QuotaConfig(teams=out, flavor_cost=COST)


def build_jobs(rng: random.Random, n: int, teams: int) -> list[PendingJob]:
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 4), (4, 8), (8, 8), (16, 8), (2, 1)]
    weights = [35, 10, 10, 15, 8, 5, 7, 5, 2, 3]
    jobs = []
    for i in range(n):
        r, g = rng.choices(shapes, weights)[0]
        t = rng.randrange(teams)
        fl = (FLAVORS[t % 4],) if rng.random() < 0.6 else (FLAVORS[t % 4], FLAVORS[(t + 1) % 4])
        jobs.append(
            PendingJob(
                id=f"j{i:05d}",
                team=f"team{t:02d}",
                replicas=r,
                gpus_per_replica=g,
                flavors=fl,
                submitted_at=NOW - timedelta(seconds=rng.randint(0, 4 * 3600)),
                priority=rng.choice((0, 100, 100, 100, 1000)),
                topology_required=TopologyLevel.RACK if r >= 4 else None,
                topology_preferred=TopologyLevel.RACK if 1 < r < 4 else None,
                backend=rng.choice(("any", "any", "any", "slurm", "k8s")),
            )
        )
    return jobs


def with_queues(quotas: QuotaConfig, jobs: list[PendingJob], usage: Usage, n: int,
                seed: int, share: float | None = None
                ) -> tuple[QuotaConfig, list[PendingJob], Usage]:
    """Each team with queues q0..q{n-1} of weights 1..n (and `share`, if given), each job in
    one of them, and the GPUs each queue holds (its team's in-use GPUs split at random)."""
    rng = random.Random(seed + 1)
    names = [f"q{i}" for i in range(n)]
    shares = {q: share for q in names} if share is not None else {}
    teams = {t.name: replace(t, queue_weights={q: float(i + 1) for i, q in enumerate(names)},
                             queue_shares=shares)
             for t in quotas.teams.values()}
    held: dict[tuple[str, str], int] = {}
    by_flavor: dict[tuple[str, str, str], int] = {}
    for (team, flavor), gpus in usage.in_use.items():
        for _ in range(gpus // 8):
            q = rng.choice(names)
            held[(team, q)] = held.get((team, q), 0) + 8
            by_flavor[(team, q, flavor)] = by_flavor.get((team, q, flavor), 0) + 8
    return (replace(quotas, teams=teams), [replace(j, queue=rng.choice(names)) for j in jobs],
            replace(usage, queue_gpus=held, queue_flavor_gpus=by_flavor))


def build_usage(rng: random.Random, quotas: QuotaConfig) -> Usage:
    in_use = {}
    for t in quotas.teams.values():
        for f in t.quotas:
            in_use[(t.name, f)] = rng.randint(0, 300)
    return Usage(in_use=in_use)


def durable(args: argparse.Namespace) -> None:
    """A backlog admitted in one cycle on a temporary SQLite (or `--db`)."""
    import tempfile
    from pathlib import Path

    from backends.sim.backend import SimBackend, SimClock, SimPoolSpec
    from bench.reconcile import CONFIG, spec
    from broker.config import parse_config
    from broker.control import admission
    from broker.control.plane import ControlPlane
    from broker.orchestration.submission import Submission, submit_many
    from broker.store import open_database

    url = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.db'}"
    db = open_database(url, sqlite_synchronous=args.synchronous)
    config = parse_config(CONFIG)
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    nodes = (args.jobs + 7) // 8 + 50
    sim = SimBackend("sim", "slurm", [SimPoolSpec("big", "a100-80g", blocks=1,
                     racks_per_block=max(1, nodes // 25), nodes_per_rack=25)], clock, seed=1)
    plane = ControlPlane(db, config, {"sim": sim}, clock=lambda: clock.now)
    for start in range(0, args.jobs, 500):
        submit_many(db, config, [Submission(spec(i), "bench")
                                 for i in range(start, min(args.jobs, start + 500))])
    if args.per_job:
        from broker.control import admission_writes

        admission_writes.BATCH = False
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    result = admission.run_admission(plane, limit=args.jobs)
    took = time.perf_counter() - t0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats(args.sort).print_stats(40)
    admitted = result.record.admitted
    print(f"durable admission ({'per job' if args.per_job else 'batched'}, "
          f"{db.dialect} synchronous={args.synchronous}): {admitted} admitted in {took:.2f} s "
          f"{admitted / took:.0f} admissions/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--per-job", action="store_true")
    ap.add_argument("--db", default=None)
    ap.add_argument("--synchronous", default="FULL")
    ap.add_argument("--sort", default="cumulative", help="profile order (with --profile)")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--teams", type=int, default=50)
    ap.add_argument("--cohorts", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--queues", type=int, default=1, help="queues per team (1: none)")
    ap.add_argument("--share", type=float, default=None,
                    help="with --queues: every queue's share of its team's quota")
    args = ap.parse_args()
    if args.durable:
        durable(args)
        return
    rng = random.Random(args.seed)
    inv = build_inventory(rng, args.nodes)
    quotas = build_quotas(args.teams, args.cohorts)
    jobs = build_jobs(rng, args.jobs, args.teams)
    usage = build_usage(rng, quotas)
    if args.queues > 1:
        quotas, jobs, usage = with_queues(quotas, jobs, usage, args.queues, args.seed,
                                          args.share)
    gpus = sum(p.total_gpus for p in inv.pools)
    free = sum(p.free_gpus for p in inv.pools)
    demand = sum(j.total_gpus for j in jobs)
    print(f"inventory: {len(inv.pools)} pools, {gpus} GPUs ({free} free); demand {demand} GPUs")
    if args.profile:
        import cProfile
        import pstats

        cProfile.runctx(
            "admission_cycle(jobs, inv, quotas, usage, NOW)",
            globals(),
            locals(),
            "/tmp/admission.prof",
        )
        pstats.Stats("/tmp/admission.prof").sort_stats("cumulative").print_stats(25)
    times = []
    result = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        result = admission_cycle(jobs, inv, quotas, usage, NOW)
        times.append(time.perf_counter() - t0)
    assert result is not None
    rec = result.record
    print(f"cycle: admitted {rec.admitted}, waiting {rec.waiting}; digest {rec.inputs_digest}")
    print("reasons: " + ", ".join(f"{k}={v}" for k, v in rec.reasons))
    p50 = statistics.median(times)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"cycle times ms: {', '.join(f'{t * 1000:.0f}' for t in times)}; peak RSS {peak_mb:.0f} MB"
    )
    print(
        f"admission: {len(jobs)} jobs {args.nodes} nodes {len(jobs) / p50:.0f} decisions/s "
        f"cycle p50 {p50 * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
