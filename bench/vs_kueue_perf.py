"""Kueue's scheduler performance test beside Isthmus on the same generator (issue 30, part 1).

Kueue's side is Kueue's own harness, unchanged: `test/performance/scheduler` of the Go module
sigs.k8s.io/kueue (runner + minimalkueue against envtest's kube-apiserver and etcd, the ones
deploy/testenv/k8s builds), run by `bench/kueue_perf/run_kueue.sh`; this module reads what
its runner wrote (summary.yaml, minimalkueue.stats.yaml, cqStates.csv).

Isthmus's side reads the same `generator.yaml` (only its YAML format: cohorts x ClusterQueues
with nominal quota and borrowing limit, workload sets with count, creation interval, class,
runtime, priority and request) and drives the real control loop over it:

- each ClusterQueue is a team in its cohort with the quota of one flavor (`request: 1` of
  Kueue's CPU resource is one GPU), nominal and borrowing limit as written; Kueue's
  `reclaimWithinCohort: Any` is Isthmus's reclaim of lent quota from borrowing teams of the
  cohort, `withinClusterQueue: LowerPriority` its preemption within the team of lower
  priority (each workload priority value becomes a preempting priority class, never across
  teams). Kueue's test preempts without protection windows and requeues evicted workloads
  at once and without limit: `policies.preemption.min_runtime` and `protect_near_end` 0,
  `policies.retry.max_preemptions` 1000, `cancel_grace` 0. No other policy setting is
  changed from its default.
- capacity never binds: Kueue's test has no nodes (its only limit is the quota); here one
  simulated pool of `--nodes` nodes of `--gpus-per-node` GPUs (default 90 x 20: three times
  the sum of the nominal quotas of baseline, in nodes that fit the largest request).
- arrivals as Kueue's generator makes them: every workload set of every queue is a sequence
  whose k-th workload (from 0) is created (k+1) x its interval after the start; each
  workload runs its `runtimeMs` on the simulated backend (`backends.sim`, start-up delay 0)
  whose clock is wall time.
- the passes (admission with its preemptions, dispatch, the backend's reconciler) run back to
  back in this process as the runtime runs them when woken, with the arrivals due submitted
  (`submit_many`, one transaction) before each admission; on SQLite (a temporary file) and/or
  PostgreSQL (`--pg URL`, or a throwaway server as bench/loop_cost.py starts one).

Metrics, computed as Kueue's runner does (test/performance/scheduler/runner/recorder):
- wall time: Kueue's checker compares minimalkueue's process wall time (`wallMs`: from
  its start, before the generator, until the recorder has seen every queue empty, polled
  every 5 s); Isthmus's is from the start of the arrivals (the teams exist) to the last
  workload's end.
- ClusterQueue usage: sum over the queues of the integral of the quota held (GPUs of
  admitted, unfinished workloads) over time, divided by the sum of nominal quotas times the
  class's observed span (Kueue: first to last ClusterQueue event; Isthmus: start to the last
  end); the minimum is the same per queue.
- time to admission: per workload from its creation to its last admission (Kueue's recorder
  overwrites it on each re-admission after an eviction), averaged per class.

    .venv/bin/python -m bench.vs_kueue_perf [--config baseline] [--kueue-out DIR | --run-kueue]
        [--db sqlite|postgres|both]

Last line: ``kueue-perf: kueue <W1> s isthmus <W2> s ratio <X> usage kueue <u1>% isthmus
<u2>% admission large/medium/small kueue <a> <b> <c> s isthmus <d> <e> <f> s`` (Isthmus's
figures from the first database run; `-` for what was not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from backends.base import Backend
from backends.sim.backend import DURATION_ENV
from backends.sim.clock import WallClock
from backends.sim.live import LiveSimBackend
from backends.sim.model import SimFailures, SimPoolSpec
from broker.config import IsthmusConfig, parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.lease import LeaderLease
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.domain.spec import JobSpec
from broker.orchestration.submission import Submission, submit_many
from broker.store import open_database
from broker.store.records import JOBS
from broker.store.tables import EVENTS
from broker.wiring.runtime import control_params

HOLDING = frozenset({"ADMITTED", "PREPARING", "RUNNING"})
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")
CLASSES = ("large", "medium", "small")
FLAVOR = "perf"
BACKEND = "sim-perf"
POOL = "perf-pool"
KUEUE_VERSION = "v0.17.0"


# ---- the generator's configuration --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    cohort: str
    cls: str
    nominal: int
    borrowing_limit: int | None
    reclaim_within_cohort: str
    within_cluster_queue: str


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    queue: str
    cls: str
    request: int
    runtime_s: float
    priority: int
    arrival_s: float
    """Seconds after the start at which Kueue's generator creates it (at the earliest)."""


@dataclass(frozen=True, slots=True)
class Generator:
    cohorts: tuple[str, ...]
    queues: tuple[Queue, ...]
    workloads: tuple[Workload, ...]

    @property
    def priorities(self) -> tuple[int, ...]:
        return tuple(sorted({w.priority for w in self.workloads}))


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}: a count >= 0, got {value!r}")
    return value


def _quantity(value: Any, what: str) -> int:
    """A whole-unit resource quantity ("20", 20); Kueue's milli-units are not supported."""
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"{what}: a whole number of units, got {value!r}")
    return int(text)


def parse_generator(text: str) -> Generator:
    """The cohorts, queues and workloads a Kueue performance `generator.yaml` describes, named
    and timed as Kueue's generator (runner/generator) creates them."""
    doc = yaml.safe_load(text) or {}
    if doc.get("topology"):
        raise ValueError("TAS configurations (topology:) are not supported")
    cohort_sets = doc.get("cohorts") or []
    if not cohort_sets:
        raise ValueError("config must contain at least one cohort")
    cohorts: list[str] = []
    queues: list[Queue] = []
    workloads: list[Workload] = []
    for cset in cohort_sets:
        for ci in range(_count(cset.get("count", 0), "cohort count")):
            cohort = f"{cset['className']}-{ci}"
            cohorts.append(cohort)
            for qsi, qset in enumerate(cset.get("queuesSets") or []):
                for qi in range(_count(qset.get("count", 0), "queue count")):
                    name = f"{qset['className']}-{qsi}-{qi}-{cohort}"
                    limit = qset.get("borrowingLimit")
                    queues.append(Queue(
                        name, cohort, qset["className"],
                        _quantity(qset.get("nominalQuota", 0), f"{name} nominalQuota"),
                        None if limit is None else _quantity(limit, f"{name} borrowingLimit"),
                        str(qset.get("reclaimWithinCohort", "Never")),
                        str(qset.get("withinClusterQueue", "Never"))))
                    for wsi, wset in enumerate(qset.get("workloadsSets") or []):
                        interval = _count(wset.get("creationIntervalMs", 0), "interval") / 1000
                        templates = wset.get("workloads") or []
                        k = 0
                        for si in range(_count(wset.get("count", 0), "workload count")):
                            for ti, wt in enumerate(templates):
                                k += 1  # the generator waits an interval before each create
                                workloads.append(Workload(
                                    f"{wt['className']}-{wsi}-{si}-{ti}", name,
                                    wt["className"],
                                    _quantity(wt.get("request", 0), f"{name} request"),
                                    _count(wt.get("runtimeMs", 0), "runtimeMs") / 1000,
                                    int(wt.get("priority", 0)), k * interval))
    return Generator(tuple(cohorts), tuple(queues), tuple(workloads))


# ---- the metrics, as Kueue's runner computes them --------------------------------------------

@dataclass(slots=True)
class Timeline:
    """One workload's story: created, its quota holds [start, end), finished."""

    cls: str
    queue: str
    gpus: int
    created: float
    holds: list[tuple[float, float]] = field(default_factory=list)
    finished: float | None = None


@dataclass(frozen=True, slots=True)
class Metrics:
    wall_s: float
    usage_pct: float
    """Sum over queues of quota-seconds held / (sum of nominal quotas x span), in %."""
    min_usage_pct: float
    admission_s: Mapping[str, float]
    """Mean seconds from creation to the last admission, per workload class."""
    counts: Mapping[str, int]
    unfinished: int


def metrics(timelines: Iterable[Timeline], nominal: Mapping[str, int], start: float) -> Metrics:
    """Kueue's runner's figures from workload timelines (times in seconds, any origin):
    wall and span from `start` to the last finish; usage per queue of `nominal`."""
    tls = list(timelines)
    if not tls:
        raise ValueError("no workloads")
    ends = [t.finished for t in tls if t.finished is not None]
    last = max(ends) if ends else max((e for t in tls for _, e in t.holds), default=start)
    span = last - start
    if span <= 0:
        raise ValueError("the last finish is not after the start")
    used: dict[str, float] = defaultdict(float)
    admit: dict[str, list[float]] = defaultdict(list)
    for t in tls:
        for s, e in t.holds:
            used[t.queue] += t.gpus * (min(e, last) - s)
        # a workload never admitted counts 0, as the recorder's zero value does
        admit[t.cls].append(t.holds[-1][0] - t.created if t.holds else 0.0)
    quota = sum(nominal.values())
    per_queue = [used.get(q, 0.0) / (n * span) for q, n in nominal.items() if n > 0]
    return Metrics(
        wall_s=span,
        usage_pct=100 * sum(used.get(q, 0.0) for q in nominal) / (quota * span),
        min_usage_pct=100 * min(per_queue) if per_queue else 0.0,
        admission_s={c: statistics.fmean(v) for c, v in admit.items()},
        counts={c: len(v) for c, v in admit.items()},
        unfinished=len(tls) - len(ends),
    )


def holds_from_events(events: Iterable[tuple[str, float]]) -> tuple[list[tuple[float, float]],
                                                                     float | None]:
    """A job's quota holds and its finish from its events (to_state, time) in order: a hold
    starts at ADMITTED and ends at the first move out of ADMITTED/PREPARING/RUNNING."""
    holds: list[tuple[float, float]] = []
    opened: float | None = None
    finished = None
    for to_state, at in events:
        if to_state == "ADMITTED" and opened is None:
            opened = at
        elif to_state not in HOLDING and opened is not None:
            holds.append((opened, at))
            opened = None
        if to_state == "SUCCEEDED":
            finished = at
    if opened is not None:
        holds.append((opened, math.inf))
    return holds, finished


# ---- Kueue's side: what its runner wrote ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KueueResult:
    wall_s: float
    usage_pct: float
    min_usage_pct: float | None
    admission_s: Mapping[str, float]
    counts: Mapping[str, int]
    user_s: float
    sys_s: float
    dropped_events: int


def _ts(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def read_kueue(out: Path) -> KueueResult:
    """The runner's figures in `out`: usage as its checker computes it (cpuUsed x 100 /
    (nominalQuota x (lastEventTime - firstEventTime)), over every ClusterQueue class)."""
    summary = yaml.safe_load((out / "summary.yaml").read_text())
    stats = yaml.safe_load((out / "minimalkueue.stats.yaml").read_text())
    used = quota_ms = 0.0
    for group in (summary.get("clusterQueueClasses") or {}).values():
        span = (_ts(group["lastEventTime"]) - _ts(group["firstEventTime"])).total_seconds()
        used += float(group["cpuUsed"])
        quota_ms += float(group["nominalQuota"]) * span * 1000
    per_cq = []
    cq_csv = out / "cqStates.csv"
    if cq_csv.exists():
        with cq_csv.open() as f:
            for row in csv.DictReader(f):
                q, t = float(row["CPU quota (mCPU)"]), float(row["monitor time (ms)"])
                if q > 0 and t > 0:
                    per_cq.append(float(row["CPU used (mCPU * ms)"]) / (q * t))
    classes = summary.get("workloadClasses") or {}
    return KueueResult(
        wall_s=float(stats["wallMs"]) / 1000,
        usage_pct=100 * used / quota_ms if quota_ms else 0.0,
        min_usage_pct=100 * min(per_cq) if per_cq else None,
        admission_s={c: float(v["averageTimeToAdmissionMs"]) / 1000 for c, v in classes.items()},
        counts={c: int(v["count"]) for c, v in classes.items()},
        user_s=float(stats.get("userMs", 0)) / 1000,
        sys_s=float(stats.get("sysMs", 0)) / 1000,
        dropped_events=int(summary.get("droppedWorkloadEvents", 0) or 0),
    )


def kueue_module_dir() -> Path:
    out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "sigs.k8s.io" / f"kueue@{KUEUE_VERSION}"


def generator_path(config: str) -> Path:
    p = Path(config)
    if p.is_file():
        return p
    return kueue_module_dir() / "test/performance/scheduler/configs" / config / "generator.yaml"


def run_kueue(config: str) -> Path:
    script = Path(__file__).resolve().parent / "kueue_perf" / "run_kueue.sh"
    done = subprocess.run([str(script), config], stdout=subprocess.PIPE, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


# ---- Isthmus's side -------------------------------------------------------------------------

def priority_class(value: int) -> str:
    return f"p{value}"


def isthmus_config(gen: Generator, nodes: int, gpus_per_node: int,
                   protection_s: float | None = None) -> IsthmusConfig:
    for q in gen.queues:
        if q.reclaim_within_cohort != "Any":
            raise ValueError(f"{q.name}: reclaimWithinCohort {q.reclaim_within_cohort} "
                             "has no equivalent here (a team always reclaims: Any)")
        if q.within_cluster_queue not in ("LowerPriority", "Never"):
            raise ValueError(f"{q.name}: withinClusterQueue {q.within_cluster_queue} "
                             "has no equivalent here (LowerPriority or Never)")
    biggest = max((w.request for w in gen.workloads), default=1)
    if biggest > gpus_per_node:
        raise ValueError(f"a request of {biggest} does not fit a node of {gpus_per_node}")
    preempting = any(q.within_cluster_queue == "LowerPriority" for q in gen.queues)
    protection = ({} if protection_s is None
                  else {"min_runtime": protection_s, "protect_near_end": protection_s})
    teams = []
    for q in gen.queues:
        quota: dict[str, Any] = {"nominal": q.nominal}
        if q.borrowing_limit is not None:
            quota["borrowing_limit"] = q.borrowing_limit
        teams.append({"name": q.name, "cohort": q.cohort, "quotas": {FLAVOR: quota}})
    return parse_config({
        "auth": {"mode": "none"},
        "limits": {"max_replicas": 64},
        "control": {"inventory_wait": 60, "observe_timeout": 600, "lost_grace": 600},
        "policies": {"preemption": protection, "retry": {"max_preemptions": 1000},
                     "cancel_grace": 0},
        "priority_classes": [{"name": priority_class(v), "value": v, "preempting": preempting}
                             for v in gen.priorities],
        "flavors": [{"name": FLAVOR, "gpu_model": "perf", "gpu_memory_gb": 80}],
        "backends": [{"name": BACKEND, "kind": "k8s"}],
        "pools": [{"name": POOL, "backend": BACKEND, "flavor": FLAVOR,
                   "capacity": {"nodes": nodes, "gpus_per_node": gpus_per_node,
                                "nodes_per_rack": 10}}],
        "cohorts": [{"name": c} for c in gen.cohorts],
        "teams": teams,
    })


def job_spec(w: Workload) -> JobSpec:
    return JobSpec.model_validate({
        "name": w.name, "team": w.queue, "priority": priority_class(w.priority),
        "gang": {"replicas": 1, "gpus_per_replica": w.request}, "flavors": [FLAVOR],
        "entrypoint": {"image": "registry.local/perf:1", "command": ["true"]},
        "env": {DURATION_ENV: f"{w.runtime_s:g}"}, "max_runtime": "1h",
    })


PHASES = ("submit", "admission", "dispatch", "reconcile")


@dataclass(slots=True)
class Phase:
    calls: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def add(self, cpu0: float, wall0: float) -> None:
        self.calls += 1
        self.cpu_s += time.process_time() - cpu0
        self.wall_s += time.perf_counter() - wall0


@dataclass
class IsthmusRun:
    db: str
    start: float
    timelines: list[Timeline]
    passes: int
    submit_lag_s: list[float]
    cpu_s: float
    wall_s: float
    states: dict[str, int]
    phases: dict[str, Phase]
    pending: list[int]
    """Jobs each admission cycle considered."""


def run_isthmus(gen: Generator, url: str, db_name: str, nodes: int, gpus_per_node: int,
                timeout_s: float, protection_s: float | None = None) -> IsthmusRun:
    cfg = isthmus_config(gen, nodes, gpus_per_node, protection_s)
    arrivals = sorted(gen.workloads, key=lambda w: w.arrival_s)
    specs = [job_spec(w) for w in arrivals]
    db = open_database(url)
    clock = WallClock(1.0)
    per_rack = 10
    sim = LiveSimBackend(
        BACKEND, "k8s",
        [SimPoolSpec(POOL, FLAVOR, gpus_per_node=gpus_per_node, nodes_per_rack=per_rack,
                     racks_per_block=math.ceil(nodes / per_rack), node_count=nodes)],
        clock, seed=1, failures=SimFailures(start_delay_s=0.0))
    backends: dict[str, Backend] = {BACKEND: sim}
    plane = ControlPlane(db, cfg, backends, clock=lambda: clock.now, params=control_params(cfg))
    lease = LeaderLease(db, ttl=60.0)
    if not lease.try_acquire():
        raise RuntimeError("the control lease is held by another process")
    plane.epoch = lease.epoch
    plane.fence(lease.name)
    submitted, passes, lags, pending = 0, 0, [], []
    phases = {p: Phase() for p in PHASES}
    renewed = time.monotonic()
    cpu0 = time.process_time()
    start = time.time()
    while True:
        now = time.time() - start
        due = submitted
        while due < len(arrivals) and arrivals[due].arrival_s <= now:
            due += 1
        if due > submitted:
            c0, w0 = time.process_time(), time.perf_counter()
            made = submit_many(db, cfg, [Submission(s, "bench") for s in specs[submitted:due]])
            phases["submit"].add(c0, w0)
            bad = [m for m in made if isinstance(m, Exception)]
            if bad:
                raise RuntimeError(f"submission refused: {bad[0]}")
            done_at = time.time() - start
            lags += [done_at - w.arrival_s for w in arrivals[submitted:due]]
            submitted = due
        if time.monotonic() - renewed > 10:
            lease.try_acquire()
            renewed = time.monotonic()
        c0, w0 = time.process_time(), time.perf_counter()
        pending.append(run_admission(plane).record.pending)
        phases["admission"].add(c0, w0)
        c0, w0 = time.process_time(), time.perf_counter()
        run_dispatch(plane)
        phases["dispatch"].add(c0, w0)
        c0, w0 = time.process_time(), time.perf_counter()
        run_reconcile(plane, BACKEND)
        phases["reconcile"].add(c0, w0)
        passes += 1
        if submitted == len(arrivals) and _open_jobs(db) == 0:
            break
        if time.time() - start > timeout_s:
            print(f"isthmus {db_name}: gave up after {timeout_s:.0f} s", flush=True)
            break
    wall = time.time() - start
    cpu = time.process_time() - cpu0
    by_name = {(w.queue, w.name): w for w in gen.workloads}
    timelines, states = _timelines(db, by_name)
    lease.release()
    db.dispose()
    return IsthmusRun(db_name, start, timelines, passes, lags, cpu, wall, states, phases,
                      pending)


def _open_jobs(db: Any) -> int:
    with db.read() as s:
        return int(s.connection().execute(
            sa.select(sa.func.count()).select_from(JOBS).where(JOBS.c.state.not_in(TERMINAL))
        ).scalar_one())


def _timelines(db: Any, by_name: Mapping[tuple[str, str], Workload]
               ) -> tuple[list[Timeline], dict[str, int]]:
    with db.read() as s:
        conn = s.connection()
        jobs = conn.execute(sa.select(JOBS.c.id, JOBS.c.name, JOBS.c.team, JOBS.c.total_gpus,
                                      JOBS.c.created_at, JOBS.c.state)).all()
        events: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for job_id, to_state, at in conn.execute(
                sa.select(EVENTS.c.job_id, EVENTS.c.to_state, EVENTS.c.at)
                .order_by(EVENTS.c.job_id, EVENTS.c.seq)):
            events[job_id].append((to_state, at.timestamp()))
    out: list[Timeline] = []
    states: dict[str, int] = defaultdict(int)
    for job_id, name, team, gpus, created, st in jobs:
        w = by_name[(team, name)]
        holds, finished = holds_from_events(events[job_id])
        out.append(Timeline(w.cls, team, gpus, created.timestamp(), holds, finished))
        states[st] += 1
    return out, dict(states)


def _pg_url(pg: str | None, stack: Any) -> str:
    from bench.loop_cost import _pg_database

    if pg is None:
        from bench.soak import Postgres

        server = Postgres()
        stack.callback(server.stop)
        pg = server.url
    return _pg_database(pg, "kueue_perf")


# ---- the report -----------------------------------------------------------------------------

def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def last_line(k: KueueResult | None, i: Metrics | None) -> str:
    ratio = k.wall_s / i.wall_s if k is not None and i is not None else None

    def adm(m: KueueResult | Metrics | None) -> str:
        return " ".join(_f(m.admission_s.get(c) if m is not None else None) for c in CLASSES)

    return (f"kueue-perf: kueue {_f(k.wall_s if k else None)} s isthmus "
            f"{_f(i.wall_s if i else None)} s ratio {_f(ratio, 2)} usage kueue "
            f"{_f(k.usage_pct if k else None)}% isthmus {_f(i.usage_pct if i else None)}% "
            f"admission large/medium/small kueue {adm(k)} s isthmus {adm(i)} s")


def _pct(xs: Sequence[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))] if ys else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="baseline",
                    help="a config folder of Kueue's module (baseline) or a generator.yaml")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--kueue-out", type=Path, default=None,
                     help="an output folder of bench/kueue_perf/run_kueue.sh to report")
    src.add_argument("--run-kueue", action="store_true",
                     help="run Kueue's harness first (bench/kueue_perf/run_kueue.sh)")
    ap.add_argument("--db", choices=("sqlite", "postgres", "both", "none"), default="sqlite")
    ap.add_argument("--pg", default=None, help="a PostgreSQL URL (default: a throwaway server)")
    ap.add_argument("--nodes", type=int, default=90)
    ap.add_argument("--gpus-per-node", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="give Isthmus's run up after this many seconds")
    ap.add_argument("--protection", type=float, default=None,
                    help="policies.preemption.min_runtime and protect_near_end in seconds "
                    "(default: Isthmus's own, 600 and 900; Kueue's test has none: 0)")
    args = ap.parse_args(argv)

    gen = parse_generator(generator_path(args.config).read_text())
    nominal = {q.name: q.nominal for q in gen.queues}
    print(f"kueue-perf: {args.config}: {len(gen.cohorts)} cohorts, {len(gen.queues)} queues, "
          f"{len(gen.workloads)} workloads; arrivals over "
          f"{max(w.arrival_s for w in gen.workloads):.1f} s; work "
          f"{sum(w.request * w.runtime_s for w in gen.workloads):.0f} unit-s over a quota of "
          f"{sum(nominal.values())}", flush=True)
    work = sum(w.request * w.runtime_s for w in gen.workloads)
    quota = sum(nominal.values())
    kueue = None
    out = run_kueue(args.config) if args.run_kueue else args.kueue_out
    if out is not None:
        kueue = read_kueue(out)
        print(f"kueue ({out}): wall {kueue.wall_s:.1f} s (minimalkueue CPU user "
              f"{kueue.user_s:.1f} s sys {kueue.sys_s:.1f} s), usage {kueue.usage_pct:.1f}% "
              f"(min per queue {_f(kueue.min_usage_pct)}%), admission "
              + ", ".join(f"{c} {kueue.admission_s.get(c, 0):.1f} s" for c in CLASSES)
              + f"; workloads {dict(kueue.counts)}, dropped events {kueue.dropped_events}; "
              f"useful work {100 * work / (quota * kueue.wall_s):.1f}% of the quota over the "
              "wall time", flush=True)
    first: Metrics | None = None
    with contextlib.ExitStack() as stack:
        dbs: list[tuple[str, str]] = []
        if args.db in ("sqlite", "both"):
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kueue-perf-")))
            dbs.append(("sqlite", f"sqlite:///{tmp / 'isthmus.db'}"))
        if args.db in ("postgres", "both"):
            dbs.append(("postgres", _pg_url(args.pg, stack)))
        for name, url in dbs:
            run = run_isthmus(gen, url, name, args.nodes, args.gpus_per_node, args.timeout,
                              args.protection)
            m = metrics(run.timelines, nominal, run.start)
            lag = run.submit_lag_s
            print(f"isthmus {name}: wall {m.wall_s:.1f} s, usage {m.usage_pct:.1f}% (min per "
                  f"queue {m.min_usage_pct:.1f}%), admission "
                  + ", ".join(f"{c} {m.admission_s.get(c, 0):.1f} s" for c in CLASSES)
                  + f"; workloads {dict(m.counts)}, unfinished {m.unfinished}, states "
                  f"{run.states}; {run.passes} passes, process CPU {run.cpu_s:.1f} s "
                  f"({run.cpu_s / max(1, len(run.timelines)) * 1000:.1f} ms/workload); "
                  f"submit lag p50 {_pct(lag, 0.5):.2f} s max {max(lag, default=0):.2f} s; "
                  f"{sum(len(t.holds) > 1 for t in run.timelines)} workloads admitted more "
                  "than once", flush=True)
            n = max(1, len(run.timelines))
            for p, ph in run.phases.items():
                print(f"  {p:<10} {ph.calls:>5} calls, wall {ph.wall_s:6.1f} s, CPU "
                      f"{ph.cpu_s:6.1f} s ({ph.cpu_s / n * 1000:5.2f} ms/workload)", flush=True)
            useful = 100 * work / (quota * m.wall_s)
            print(f"  queue per admission cycle: mean {statistics.fmean(run.pending or [0]):.0f}"
                  f" max {max(run.pending or [0])}; useful work {useful:.1f}% of the quota over "
                  "the wall time", flush=True)
            first = first or m
    print(last_line(kueue, first), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
