"""CPU per job of the control loop and of the API's submit path (issue 27; not a timed test).

The real passes of the loop (admission with its preemptions, dispatch, one reconciler per
backend with the retries decided in its transactions, the retry repair and the decision-log
prune) drive `--jobs` jobs through their whole lifecycle, in process, in simulated time, on
SQLite (a temporary file, synchronous=FULL as the server opens it) and/or PostgreSQL (a
throwaway server started here, or `--pg URL`). The passes run as the runtime runs them: under
the leader's fence, in a `control_cycle` log context, with the server's logging configured
(written to /dev/null) and the garbage collector set as a started server sets it
(broker.gc_settings; the submit path's measure too). Each tick of `--tick` simulated
seconds: the tick's arrivals are submitted (not counted: that is the API's part), then
admission, dispatch, the backends move on by one tick (not counted), then each backend's
reconciler; the repair and the prune every 60 s.
The run ends when every job has ended.

Workload (seeded, `workload`): gangs of 1x1 .. 4x8 GPUs over two simulated backends (a
Slurm-like H100 partition for 8-GPU replicas, a Kubernetes-like A100 pool for the rest), four
teams, `--rate` arrivals per simulated second, run times of 30-300 s; one job in ten loses a
node on its first attempt (INFRA_TRANSIENT: FAILED, retried after its backoff on another
node); one in eight is `low` priority (running twice as long) and one in fifty a `high` 8x4
A100 gang, which preempts lower-priority work when its pool is full. The pools are sized from
the workload to keep the queue steady (`config`), so that the cost per job does not grow with
--jobs; the `steady` line shows the queue through the arrivals and says when it grew.

The backends are `backends.sim` simulators. Their own CPU is measured, not guessed: every call
into a simulator (inventory, submit, observe and the facts it builds lazily, cancel, lookup)
runs under `time.process_time` in `Metered`, and that share is subtracted from the passes'
process CPU. What is left is the loop's: Isthmus code, SQLAlchemy, the database driver (and on
SQLite the database engine itself, which runs in this process; PostgreSQL's server CPU is in
another process and not counted).

The submit path: `POST /v1/jobs` through the FastAPI app in process (httpx's ASGI transport,
`--api-concurrency` requests in flight so that group commit batches as under load), on a fresh
database of each kind run; the client's own CPU, measured by sending the same requests to an
ASGI app that only answers 201, is subtracted.

Last line: `loop-cost: sqlite <a> ms/job postgres <b> ms/job api-submit <c> ms/job` (a database
not run shows `-`; api-submit is the larger of the databases run). `--profile FILE` writes a
profile of the loop's passes (the first database run; the figures of that run include the
profiler's overhead): cProfile stats, timed in process CPU, to FILE and a text summary (by
cumulative and by own time) to FILE.txt, or with `--profiler pyinstrument` (if installed; it
samples wall time) its text report to FILE.txt and HTML to FILE.html.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import logging
import math
import os
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from backends.base import (
    Backend,
    CancelResult,
    Observed,
    Rendering,
    SubmitRequest,
    SubmitResult,
)
from backends.sim.backend import DURATION_ENV, SimBackend, SimClock, SimFailures, SimPoolSpec
from backends.sim.faults import FAIL_ANNOTATION
from broker import gc_settings, ledger, logs
from broker.config import IsthmusConfig, parse_config
from broker.control.admission import run_admission
from broker.control.decision_log import prune as prune_decisions
from broker.control.dispatch import run_dispatch
from broker.control.lease import LeaderLease
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.control.requeue import repair_undecided
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot
from broker.domain.spec import JobSpec
from broker.orchestration.replay import check_all
from broker.orchestration.submission import Submission, submit_many
from broker.store import Database, open_database
from broker.store.records import JOBS
from broker.store.tables import ATTEMPTS as ATTEMPTS_TABLE
from broker.wiring.runtime import control_params

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")
TEAMS = ("vision", "language", "speech", "robotics")
GPUS_PER_NODE = 8
UPKEEP_EVERY_S = 60.0
"""The retry repair and the decision-log prune run this often (the runtime's intervals)."""

SHAPES: tuple[tuple[int, int, float], ...] = (
    # replicas, GPUs per replica, share of the jobs
    (1, 1, 0.20), (1, 2, 0.20), (1, 4, 0.20), (1, 8, 0.20), (2, 8, 0.12), (4, 8, 0.08),
)
LOW_SHARE, HIGH_SHARE, FAIL_SHARE = 1 / 8, 1 / 50, 1 / 10
RUN_S = (30.0, 300.0)
LOW_RUN_FACTOR = 2.0
"""Low-priority work runs longer: the kind a high-priority job finds in its way."""
HIGH_SHAPE = (8, 4)
"""High-priority jobs are wide A100 gangs: the ones that seldom find room without preempting."""
A100_ROOM = 1.12
"""The A100 pool's GPUs per GPU its jobs keep busy on average (see `config`). At 1.05 (until
2026-12-06) the pool was overloaded: the first attempts that fail and the preempted work run
again took more than the 5% left, every preemption made more work to run again, and the queue
grew through the run (at 5,000 jobs from 16.5 jobs in the first fifth of the arrivals to 97 in
the last, 759 attempts preempted): the cost per job then grew with --jobs. At 1.12 the queue
stays within 1.5x of its first fifth (15 to 23 jobs at 5,000; the `steady` line), the cost per
job is the same at 2,000 and 5,000 jobs, and the high-priority gangs still preempt."""
STEADY_RATIO = 1.5
"""The queue is called level when its mean over the last fifth of the arrivals is at most this
many times that of the first fifth (`Run.steadiness`)."""


def config(rate: float, specs: Sequence[dict[str, Any]], tick: float = 5.0) -> IsthmusConfig:
    """Two simulated backends whose pools fit the offered load: `specs` arriving at `rate` per
    simulated second keep this many GPUs of each flavor busy on average (run time, the
    simulator's start-up, a tick until the end is seen); the H100 partition has 30% more, the
    A100 pool A100_ROOM times as much (retries and preempted work run again take the rest, so
    high-priority gangs find low-priority work in their way there); quotas never bind."""
    busy = {"h100-80g": 0.0, "a100-80g": 0.0}
    held_beyond_run = SimFailures().start_delay_s + tick
    for spec in specs:
        gang = spec["gang"]
        busy[spec["flavors"][0]] += (gang["replicas"] * gang["gpus_per_replica"]
                                     * (float(spec["env"][DURATION_ENV]) + held_beyond_run))
    span = max(1, len(specs)) / rate
    nodes = {f: max(4, math.ceil(b / span * (1.3 if f == "h100-80g" else A100_ROOM)
                                 / GPUS_PER_NODE))
             for f, b in busy.items()}
    quota = {f: {"nominal": 100_000} for f in busy}
    return parse_config({
        "auth": {"mode": "none"},
        "limits": {"max_replicas": 64},
        "tenancy": {"exempt_key_prefixes": ["isthmus.io/sim-"]},
        "control": {"preemption_min_runtime": 5, "preemption_protect_near_end": 30,
                    # never a wall-clock wait: a slow answer on a busy machine must not
                    # change what the loop decides
                    "inventory_wait": 60, "observe_timeout": 600, "lost_grace": 600},
        "priority_classes": [{"name": "low", "value": 0}, {"name": "normal", "value": 100},
                             {"name": "high", "value": 1000, "preempting": True}],
        "flavors": [{"name": "h100-80g", "gpu_model": "H100", "gpu_memory_gb": 80,
                     "cost_weight": 2.0},
                    {"name": "a100-80g", "gpu_model": "A100", "gpu_memory_gb": 80}],
        # the simulated Slurm runs images (a site with pyxis), as its SimBackend does
        "backends": [{"name": "sim-slurm", "kind": "slurm",
                      "settings": {"container": {"runtime": "pyxis"}}},
                     {"name": "sim-k8s", "kind": "k8s"}],
        "pools": [
            {"name": "slurm-h100", "backend": "sim-slurm", "flavor": "h100-80g",
             "capacity": {"nodes": nodes["h100-80g"], "gpus_per_node": GPUS_PER_NODE,
                          "nodes_per_rack": 8}},
            {"name": "k8s-a100", "backend": "sim-k8s", "flavor": "a100-80g",
             "capacity": {"nodes": nodes["a100-80g"], "gpus_per_node": GPUS_PER_NODE,
                          "nodes_per_rack": 8}},
        ],
        "cohorts": [{"name": "research"}],
        "teams": [{"name": t, "cohort": "research", "quotas": quota} for t in TEAMS],
    })


def flavor_of(gpus_per_replica: int) -> str:
    return "h100-80g" if gpus_per_replica == GPUS_PER_NODE else "a100-80g"


def workload(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """`n` job specs (JSON-shaped), the same for the same `n` and `seed`."""
    rng = random.Random(seed)
    shapes = [(r, g) for r, g, _ in SHAPES]
    weights = [w for _, _, w in SHAPES]
    out = []
    for i in range(n):
        replicas, gpus = rng.choices(shapes, weights)[0]
        draw = rng.random()
        priority = "low" if draw < LOW_SHARE else "high" if draw < LOW_SHARE + HIGH_SHARE \
            else "normal"
        if priority == "high":
            replicas, gpus = HIGH_SHAPE
        run = rng.uniform(*RUN_S) * (LOW_RUN_FACTOR if priority == "low" else 1.0)
        spec: dict[str, Any] = {
            "name": f"lc-{i}", "team": TEAMS[i % len(TEAMS)], "priority": priority,
            "gang": {"replicas": replicas, "gpus_per_replica": gpus},
            "flavors": [flavor_of(gpus)],
            "topology": {"preferred": "rack"} if replicas > 1 else {},
            "entrypoint": {"image": "registry.local/train:1.0",
                           "command": ["python", "train.py"]},
            "env": {DURATION_ENV: f"{run:.0f}"},
            "max_runtime": "2h", "retry": {"max_attempts": 3},
        }
        if rng.random() < FAIL_SHARE:
            spec["annotations"] = {FAIL_ANNOTATION: "node-loss"}
        out.append(spec)
    return out


class Metered:
    """A backend whose own CPU (process time) is added up in `cpu`, to be subtracted from the
    loop's: every call into `inner`, and each fact an `Observed` answer builds when read."""

    def __init__(self, inner: SimBackend) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.kind: str = inner.kind
        self.cpu = 0.0
        self.calls: Counter[str] = Counter()

    def _timed(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls[op] += 1
        t0 = time.process_time()
        try:
            return fn(*args)
        finally:
            self.cpu += time.process_time() - t0

    def inventory(self) -> InventorySnapshot:
        out: InventorySnapshot = self._timed("inventory", self.inner.inventory)
        return out

    def render(self, request: SubmitRequest) -> Rendering:
        out: Rendering = self._timed("render", self.inner.render, request)
        return out

    def submit(self, request: SubmitRequest) -> SubmitResult:
        out: SubmitResult = self._timed("submit", self.inner.submit, request)
        return out

    def lookup(self, name: str) -> Fact | None:
        out: Fact | None = self._timed("lookup", self.inner.lookup, name)
        return out

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        out: CancelResult = self._timed("cancel", self.inner.cancel, name, grace_seconds)
        return out

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        facts: Sequence[Fact] = self._timed("observe", self.inner.observe, names)
        if isinstance(facts, Observed):
            built = facts
            return Observed(facts.said, lambda n: self._timed("fact", built.fact, n),
                            facts.newest)
        return facts


PASSES = ("admission", "dispatch", "reconcile", "upkeep")


@dataclass
class PassCost:
    calls: int = 0
    cpu: float = 0.0
    """Process CPU seconds of the pass, the backend's share included."""
    backend: float = 0.0
    """The simulators' share of `cpu`."""

    @property
    def loop(self) -> float:
        return self.cpu - self.backend


@dataclass
class LoopRun:
    db: str
    jobs: int
    ticks: int = 0
    passes: dict[str, PassCost] = field(default_factory=lambda: {p: PassCost() for p in PASSES})
    states: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    failed_attempts: int = 0
    preempted_attempts: int = 0
    events: int = 0
    problems: list[str] = field(default_factory=list)
    wall: float = 0.0
    pending: list[int] = field(default_factory=list)
    """Jobs each admission cycle considered (its decision record's `pending`)."""
    arriving: int = 0
    """The admission cycles up to the one that met the last arrival (the span over which jobs
    arrive; at under one arrival a tick some of them met none)."""

    def steadiness(self) -> tuple[list[float], bool]:
        """The queue's mean in each fifth of the cycles that met arrivals, and whether it stays
        level (the last fifth's at most STEADY_RATIO times the first's): the figures are a cost
        per job only when it does, a queue that grows costs more per job the longer the run."""
        span = self.pending[:self.arriving]
        if len(span) < 5:
            return [], True
        fifths = [statistics.fmean(span[i * len(span) // 5:(i + 1) * len(span) // 5])
                  for i in range(5)]
        return fifths, fifths[-1] <= STEADY_RATIO * max(1.0, fifths[0])

    @property
    def loop_cpu(self) -> float:
        return sum(p.loop for p in self.passes.values())

    @property
    def backend_cpu(self) -> float:
        return sum(p.backend for p in self.passes.values())

    def per_job_ms(self) -> float:
        return per_job_ms(sum(p.cpu for p in self.passes.values()), self.backend_cpu, self.jobs)

    def lines(self) -> list[str]:
        n = self.jobs
        out = [f"loop {self.db}: {n} jobs in {self.ticks} ticks ({self.wall:.0f} s wall); "
               f"ended {dict(sorted(self.states.items()))}; {self.attempts} attempts "
               f"({self.failed_attempts} failed, {self.preempted_attempts} preempted); "
               f"{self.events} events; checks {'clean' if not self.problems else self.problems}",
               f"  queue per admission cycle: mean {statistics.fmean(self.pending or [0]):.1f}"
               f" max {max(self.pending or [0])} jobs"]
        fifths, level = self.steadiness()
        if fifths:
            out.append("  steady: queue by fifth of the arrivals "
                       + " ".join(f"{q:.1f}" for q in fifths)
                       + (": level" if level else ": GROWING (the pools are overloaded: "
                          "the cost per job grows with --jobs)"))
        for name, p in self.passes.items():
            out.append(f"  {name:<10} {p.calls:>6} passes {p.cpu:8.2f} s CPU, backend "
                       f"{p.backend:6.2f} s: {per_job_ms(p.cpu, p.backend, n):7.2f} ms/job")
        out.append(f"  {'total':<10} {'':>13} {self.loop_cpu + self.backend_cpu:8.2f} s CPU, "
                   f"backend {self.backend_cpu:6.2f} s: {self.per_job_ms():7.2f} ms/job")
        return out


def per_job_ms(cpu_s: float, backend_s: float, jobs: int) -> float:
    """Milliseconds of CPU per job once the backend's share is taken out."""
    if jobs <= 0:
        raise ValueError("jobs must be positive")
    return (cpu_s - backend_s) / jobs * 1000


class Profiler:
    """cProfile or pyinstrument around the measured passes only, or nothing."""

    def __init__(self, path: str | None, kind: str) -> None:
        self.path, self.kind = path, kind
        # process CPU as the clock, not wall time: I/O waits (SQLite's fsync at commit) and
        # waits for the gate's worker threads would otherwise count on a busy machine; the
        # workers' CPU (inventory and observe run there) shows under the waits for them
        self._c = cProfile.Profile(time.process_time) if path and kind == "cprofile" else None
        self._p: Any = None
        if path and kind == "pyinstrument":
            from pyinstrument import Profiler as Pyinstrument  # optional, from PyPI

            self._p = Pyinstrument(interval=0.0005)

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        if self._c is not None:
            self._c.enable()
        elif self._p is not None:
            self._p.start()
        try:
            yield
        finally:
            if self._c is not None:
                self._c.disable()
            elif self._p is not None:
                self._p.stop()

    def write(self) -> None:
        if self.path is None:
            return
        if self._c is not None:
            self._c.dump_stats(self.path)
            text = io.StringIO()
            stats = pstats.Stats(self._c, stream=text)
            stats.sort_stats("cumulative").print_stats(80)
            stats.sort_stats("tottime").print_stats(80)
            Path(f"{self.path}.txt").write_text(text.getvalue())
        elif self._p is not None:
            Path(f"{self.path}.txt").write_text(self._p.output_text(unicode=False, color=False,
                                                                    show_all=False))
            Path(f"{self.path}.html").write_text(self._p.output_html())
        print(f"profile written to {self.path}" + ("" if self._c is None else " (+ .txt)"),
              flush=True)


def simulators(cfg: IsthmusConfig, clock: SimClock, seed: int) -> dict[str, SimBackend]:
    """One simulator per configured pool's backend, shaped as the pool's capacity says."""
    sims = {}
    for i, pool in enumerate(cfg.pools):
        cap = pool.capacity
        assert cap is not None
        per_rack = cap.nodes_per_rack or GPUS_PER_NODE
        sims[pool.backend] = SimBackend(
            pool.backend, "slurm" if pool.backend == "sim-slurm" else "k8s",
            [SimPoolSpec(pool.name, pool.flavor, gpus_per_node=cap.gpus_per_node,
                         racks_per_block=math.ceil(cap.nodes / per_rack),
                         nodes_per_rack=per_rack, node_count=cap.nodes)],
            clock, seed=seed + i)
    return sims


def _submit(db: Database, cfg: IsthmusConfig, specs: Sequence[JobSpec]) -> None:
    made = submit_many(db, cfg, [Submission(s, "bench") for s in specs])
    bad = [m for m in made if isinstance(m, Exception)]
    if bad:
        raise RuntimeError(f"submission refused: {bad[0]}")


def run_loop(url: str, db_name: str, n: int, rate: float, tick: float, seed: int,
             profiler: Profiler | None = None, max_ticks: int | None = None) -> LoopRun:
    """Drive `n` jobs through the loop on the database at `url` (see the module docstring)."""
    shaped = workload(n, seed)
    cfg = config(rate, shaped, tick)
    specs = [JobSpec.model_validate(s) for s in shaped]
    db = open_database(url)
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    sims = simulators(cfg, clock, seed)
    metered = {name: Metered(b) for name, b in sims.items()}
    backends: dict[str, Backend] = dict(metered)
    plane = ControlPlane(db, cfg, backends, clock=lambda: clock.now,
                         params=control_params(cfg))
    lease = LeaderLease(db, ttl=60.0)
    if not lease.try_acquire():
        raise RuntimeError("the control lease is held by another process")
    plane.epoch = lease.epoch
    plane.fence(lease.name)
    run = LoopRun(db_name, n)
    cycles: Counter[str] = Counter()
    per_tick = rate * tick
    submitted = 0
    next_upkeep = UPKEEP_EVERY_S
    renewed = time.monotonic()
    t_start = time.perf_counter()

    def timed(name: str, loop_id: str, fn: Callable[..., Any], *args: Any) -> Any:
        cost = run.passes[name]
        cycles[loop_id] += 1
        b0 = sum(m.cpu for m in metered.values())
        t0 = time.process_time()
        with logs.control_cycle(loop_id, plane.epoch, cycles[loop_id]), \
                (profiler.on() if profiler else contextlib.nullcontext()):
            out = fn(plane, *args)
        cost.cpu += time.process_time() - t0
        cost.backend += sum(m.cpu for m in metered.values()) - b0
        cost.calls += 1
        return out

    while True:
        # not counted: the arrivals (the API's part) and the backends' own progress
        due = min(n, math.floor((run.ticks + 1) * per_tick))
        arrived = due > submitted
        if arrived:
            _submit(db, cfg, specs[submitted:due])
            submitted = due
        if time.monotonic() - renewed > 10:  # the lease keeper's renewal
            lease.try_acquire()
            renewed = time.monotonic()
        run.pending.append(timed("admission", "admission", run_admission).record.pending)
        if arrived:
            run.arriving = len(run.pending)
        timed("dispatch", "dispatch", run_dispatch)
        clock.advance(tick)
        for sim in sims.values():
            sim.sync()
        for name in sims:
            timed("reconcile", f"reconcile:{name}", run_reconcile, name)
        if run.ticks * tick >= next_upkeep:
            timed("upkeep", "retry-repair", repair_undecided)
            timed("upkeep", "decision-log", prune_decisions)
            next_upkeep += UPKEEP_EVERY_S
        run.ticks += 1
        if submitted == n and _open_jobs(db) == 0:
            break
        if max_ticks is not None and run.ticks >= max_ticks:
            run.problems.append(f"{_open_jobs(db)} jobs not ended after {run.ticks} ticks")
            break
    run.wall = time.perf_counter() - t_start
    _tally(db, run)
    lease.release()
    db.dispose()
    return run


def _open_jobs(db: Any) -> int:
    with db.read() as s:
        return int(s.connection().execute(
            sa.select(sa.func.count()).select_from(JOBS).where(JOBS.c.state.not_in(TERMINAL))
        ).scalar_one())


def _tally(db: Any, run: LoopRun) -> None:
    attempts = ATTEMPTS_TABLE
    with db.read() as s:
        conn = s.connection()
        run.states = Counter(dict(conn.execute(
            sa.select(JOBS.c.state, sa.func.count()).group_by(JOBS.c.state)).all()))
        run.attempts = int(conn.execute(sa.select(sa.func.count()).select_from(attempts))
                           .scalar_one())
        run.failed_attempts = int(conn.execute(
            sa.select(sa.func.count()).select_from(attempts)
            .where(attempts.c.failure.is_not(None))).scalar_one())
        run.preempted_attempts = int(conn.execute(
            sa.select(sa.func.count()).select_from(attempts)
            .where(attempts.c.preempted.is_(True))).scalar_one())
        run.events = int(conn.execute(sa.select(sa.func.sum(JOBS.c.last_seq))).scalar_one() or 0)
        run.problems += [str(p) for p in check_all(s)]
        run.problems += [str(p) for p in ledger.check(s)]
        held = [(k, v) for k, v in ledger.usage(s).items() if v[0]]
        if held:
            run.problems.append(f"quota still held: {held}")


# ---- the submit path --------------------------------------------------------------------

async def _post_all(client: httpx.AsyncClient, bodies: list[bytes], concurrency: int,
                    expect: int) -> None:
    headers = {"Content-Type": "application/json"}
    for start in range(0, len(bodies), concurrency):
        answers = await asyncio.gather(*(
            client.post("/v1/jobs", content=b, headers=headers)
            for b in bodies[start:start + concurrency]))
        for r in answers:
            if r.status_code != expect:
                raise RuntimeError(f"POST /v1/jobs answered {r.status_code}: {r.text[:500]}")


async def _bare_app(scope: MutableMapping[str, Any],
                    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
                    send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
    """Answers every request 201 with a small JSON body: the client's share of the CPU."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = b'{"id":"x"}'
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _client_cpu(bodies: list[bytes], concurrency: int) -> float:
    async def go() -> float:
        transport = httpx.ASGITransport(app=_bare_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            await _post_all(client, bodies[: min(50, len(bodies))], concurrency, 201)  # warm
            t0 = time.process_time()
            await _post_all(client, bodies, concurrency, 201)
            return time.process_time() - t0
    return asyncio.run(go())


def api_submit(url: str, n: int, rate: float, seed: int, concurrency: int) -> tuple[float, float]:
    """(CPU seconds of `n` submits through the app, the client's share of it), after a
    warm-up of 50 submits; the database at `url` is fresh."""
    from broker.api.app import create_app

    specs = workload(n + 50, seed + 1)
    cfg = config(rate, specs)
    bodies = [json.dumps(s).encode() for s in specs]
    db = open_database(url)
    app = create_app(cfg, db)

    async def go() -> float:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            await _post_all(client, bodies[:50], concurrency, 201)
            t0 = time.process_time()
            await _post_all(client, bodies[50:], concurrency, 201)
            return time.process_time() - t0

    try:
        cpu = asyncio.run(go())
    finally:
        db.dispose()
    return cpu, _client_cpu(bodies[50:], concurrency)


# ---- the command ------------------------------------------------------------------------

LAST_LINE = re.compile(
    r"^loop-cost: sqlite (?P<sqlite>[\d.]+|-) ms/job postgres (?P<postgres>[\d.]+|-) ms/job "
    r"api-submit (?P<api>[\d.]+|-) ms/job$")


def last_line(sqlite: float | None, postgres: float | None, api: float | None) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"
    return (f"loop-cost: sqlite {f(sqlite)} ms/job postgres {f(postgres)} ms/job "
            f"api-submit {f(api)} ms/job")


def parse_last_line(line: str) -> dict[str, float | None]:
    m = LAST_LINE.match(line.strip())
    if m is None:
        raise ValueError(f"not a loop-cost line: {line!r}")
    return {k: None if v == "-" else float(v) for k, v in m.groupdict().items()}


@contextlib.contextmanager
def databases(kind: str, pg: str | None) -> Iterator[dict[str, Callable[[str], str]]]:
    """A factory of fresh database URLs per kind asked for: temporary SQLite files, and
    fresh databases on `pg` or on a throwaway PostgreSQL server started here."""
    out: dict[str, Callable[[str], str]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="isthmus-loop-cost-"))
    if kind in ("sqlite", "both"):
        out["sqlite"] = lambda name: f"sqlite:///{tmp / name}.db"
    server = None
    if kind in ("postgres", "both"):
        base = pg
        if base is None:
            from bench.soak import Postgres

            server = Postgres()
            base = server.url
        out["postgres"] = lambda name: _pg_database(base, name)
    try:
        yield out
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _pg_database(base: str, name: str) -> str:
    """A fresh database `name` on the server of `base` (dropped first if it exists)."""
    engine = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1),
                              isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        engine.dispose()
    return base.rsplit("/", 1)[0] + f"/{name}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000, help="jobs through the loop (default 5000)")
    ap.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--pg", default=None,
                    help="a PostgreSQL URL whose server gets the benchmark's databases "
                    "(loop_cost, loop_cost_api: dropped first if they exist, left after; "
                    "default: a throwaway server started here)")
    ap.add_argument("--rate", type=float, default=2.0,
                    help="arrivals per simulated second (default 2)")
    ap.add_argument("--tick", type=float, default=5.0,
                    help="simulated seconds between passes (default 5: the runtime's "
                    "admission and reconcile intervals)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--api-jobs", type=int, default=None,
                    help="submits through the API (default: min(--jobs, 2000))")
    ap.add_argument("--api-concurrency", type=int, default=8)
    ap.add_argument("--profile", default=None, help="write a profile of the loop's passes here")
    ap.add_argument("--profiler", choices=("cprofile", "pyinstrument"), default="cprofile")
    ap.add_argument("--max-ticks", type=int, default=None,
                    help="give up after this many ticks (default: 20 x the arrival ticks + 500)")
    args = ap.parse_args(argv)
    if args.jobs <= 0 or args.rate <= 0 or args.tick <= 0 or args.api_concurrency <= 0:
        ap.error("--jobs, --rate, --tick and --api-concurrency must be positive")
    api_jobs = args.api_jobs if args.api_jobs is not None else min(args.jobs, 2000)
    max_ticks = args.max_ticks or 20 * math.ceil(args.jobs / (args.rate * args.tick)) + 500
    with server_logging():
        return _main(args, api_jobs, max_ticks)


@contextlib.contextmanager
def server_logging() -> Iterator[None]:
    """The server's logging (broker.logs.configure, INFO) written to /dev/null while the
    benchmark runs, so that the loop formats its log lines as it does in service; the
    previous logging set-up is put back after (the benchmark also runs inside tests)."""
    names = ("", logs.ROOT, "apscheduler", "alembic.runtime.plugins")
    levels = {n: logging.getLogger(n).level for n in names}
    before = list(logging.getLogger().handlers)
    with open(os.devnull, "w") as sink:
        handler = logs.configure(stream=sink)
        try:
            yield
        finally:
            root = logging.getLogger()
            root.removeHandler(handler)
            for h in before:
                if h not in root.handlers:
                    root.addHandler(h)
            for n, level in levels.items():
                logging.getLogger(n).setLevel(level)


def _main(args: argparse.Namespace, api_jobs: int, max_ticks: int) -> int:
    print(f"loop-cost: {args.jobs} jobs, {args.rate:g} arrivals/s, tick {args.tick:g} s, "
          f"seed {args.seed}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs",
          flush=True)
    loop: dict[str, float] = {}
    api: dict[str, float] = {}
    ok = True
    # the collector set as the server and `isthmus control` set it once started
    with databases(args.db, args.pg) as urls, gc_settings.settled():
        profiler = Profiler(args.profile, args.profiler) if args.profile else None
        for name, url_of in urls.items():
            run = run_loop(url_of("loop_cost"), name, args.jobs, args.rate, args.tick,
                           args.seed, profiler, max_ticks)
            if profiler is not None:
                profiler.write()
                profiler = None
            print("\n".join(run.lines()), flush=True)
            ok = ok and not run.problems
            loop[name] = run.per_job_ms()
            if api_jobs > 0:
                cpu, client = api_submit(url_of("loop_cost_api"), api_jobs, args.rate,
                                         args.seed, args.api_concurrency)
                api[name] = per_job_ms(cpu, client, api_jobs)
                print(f"api-submit {name}: {api_jobs} submits, {args.api_concurrency} in "
                      f"flight: {cpu:.2f} s CPU, client {client:.2f} s: "
                      f"{api[name]:.2f} ms/job", flush=True)
    print(last_line(loop.get("sqlite"), loop.get("postgres"),
                    max(api.values()) if api else None), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
