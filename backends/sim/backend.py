"""A simulated backend implementing `backends.base.Backend`, in virtual time.

It behaves like a small batch scheduler: one FIFO queue per pool with backfill (any pending job
that fits starts), gangs all-or-nothing, Isthmus placements honoured when their nodes are still
free (else first fit inside the placement's topology level), external non-Isthmus load arriving
as a Poisson process, job durations drawn (or given per job), and injected failures. All
randomness comes from one `random.Random(seed)`: the same seed and the same calls give the same
facts. Time moves only through `SimClock.advance` / `SimBackend.advance`.

The inventory reports, per node, when busy GPUs are expected back (`NodeSnapshot.releases`) the
way a real scheduler knows it: start + the declared time limit (the spec's max_runtime; for
external load, `ExternalLoad.limit_s` if set, else no release), never the drawn run time. The
limit is not enforced: a job running past it keeps its GPUs and its overdue release.

Like slurmctld (MinJobAge), it keeps an ended job among its jobs for `retention_s` simulated
seconds; then an Isthmus job moves to a bounded accounting (ACCOUNTING_MAX, oldest dropped
first: sacct's part), still answered by `lookup`, `logs` and `observe(names)`, and a foreign one
is forgotten. Without that, its memory and every `observe` grew with every job it had ever run
(the soak's leader grew about 20 MB a minute at 100 jobs/s).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from backends.base import (
    BackendUnavailable,
    CancelResult,
    RankLog,
    Rendering,
    SubmitRequest,
    SubmitResult,
)
from backends.sim import faults, foreign, views
from backends.sim.clock import SimClock
from backends.sim.model import ExternalLoad, Job, Node, SimFailures, SimPoolSpec, fit_nodes
from backends.sim.progress import PROGRESS_TOKEN_ENV, Report, Reporter, Reporting
from broker.domain.facts import Fact, Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import InventorySnapshot, TopologyPath
from broker.domain.reasons import FAILURE_REASON, Reason
from broker.domain.units import parse_duration

DURATION_ENV = "ISTHMUS_SIM_DURATION"
"""SubmitRequest.env key: the job's run time in seconds (else a seeded draw)."""
DURATION_ANNOTATION = "isthmus.io/sim-duration"
"""Spec annotation: the job's run time in simulated time ('90', '2m30s')."""
RESUME_ENV = "ISTHMUS_RESUME_FROM"
RETENTION_S = 300.0
"""Simulated seconds an ended job stays among the jobs (slurmctld's MinJobAge default)."""
ACCOUNTING_MAX = 5_000
"""Ended Isthmus jobs kept past their retention, for lookups (the oldest dropped first)."""
EVENTS_MAX = 100_000
"""Start and end events kept for `drain_events` (the oldest dropped first)."""

__all__ = ["DURATION_ENV", "ExternalLoad", "SimBackend", "SimClock", "SimFailures",
           "SimPoolSpec"]


def _runs(job: Job) -> bool:
    """Whether `job` runs now (its progress reports are sent only then)."""
    return job.phase is Phase.RUNNING and job.ended is None


class SimBackend:
    """Implements backends.base.Backend; see the module docstring."""

    def __init__(
        self,
        name: str,
        kind: str,
        pools: Sequence[SimPoolSpec],
        clock: SimClock,
        *,
        seed: int = 0,
        failures: SimFailures | None = None,
        external: ExternalLoad | None = None,
        duration: Callable[[random.Random], float] | None = None,
        releases: bool = True,
        reporter: Reporter | None = None,
        runtime_fraction: float | None = None,
        progress_every: float = 10.0,
        retention_s: float = RETENTION_S,
        events: bool = False,
    ) -> None:
        self.name = name
        self.retention_s = retention_s
        self.report_releases = releases
        """False: the inventory reports no releases, like a backend that cannot tell."""
        self.kind = kind
        self.clock = clock
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not secrets
        self.failures = failures or SimFailures()
        self.external = external or ExternalLoad()
        self._duration = duration or (lambda r: r.lognormvariate(7.5, 1.5))
        self.runtime_fraction = runtime_fraction
        """Run time as a fraction of max_runtime when the job names none (else a draw)."""
        self.reporter = reporter
        self.progress_every = progress_every
        self.checkpoints: dict[str, int] = {}
        """The simulated file system: the step of each job's last checkpoint."""
        self._reporting: dict[str, Job] = {}
        self._scanned = float("-inf")
        """Simulated time of the last pass over `_reporting` (`_progress`)."""
        self.reachable = True
        self.pools = {p.name: p for p in pools}
        self.nodes: dict[str, Node] = {}
        self.pool_nodes: dict[str, list[Node]] = {}
        for p in pools:
            lst = self.pool_nodes[p.name] = []
            for i in range(p.nodes):
                rack = i // p.nodes_per_rack
                topo = TopologyPath(block=f"{p.name}-b{rack // p.racks_per_block}",
                                    rack=f"r{rack % p.racks_per_block}")
                node = Node(f"{p.name}-n{i:04d}", p.name, p.gpus_per_node, p.gpus_per_node, topo)
                self.nodes[node.name] = node
                lst.append(node)
        self.jobs: dict[str, Job] = {}
        """The jobs it queues and runs, and those ended within `retention_s`."""
        self.accounting: dict[str, Job] = {}
        """Isthmus jobs ended longer ago, oldest first (ACCOUNTING_MAX)."""
        self._ended: deque[tuple[float, int, str]] = deque()
        """(end, seq, name) of the ended jobs still among `jobs`, in order of their ends."""
        self.pending: dict[str, list[Job]] = {p: [] for p in self.pools}
        self._ends: list[tuple[float, int, str]] = []
        self._seq = 0
        self._events: deque[tuple[str, str]] | None = (
            deque(maxlen=EVENTS_MAX) if events else None)
        """Kept only for a driver that asked (`events`) and drains them (`drain_events`)."""
        self._t = clock.t
        foreign.occupy(self, self.external.occupied)
        self._next_external = foreign.next_arrival(self, self._t)

    @property
    def synced_t(self) -> float:  # the simulated time the state is brought up to (`sync`)
        return self._t

    # ---- the Backend protocol ---------------------------------------------------------
    def _check(self) -> None:
        if not self.reachable:
            raise BackendUnavailable(f"simulated backend {self.name} is unreachable")

    def inventory(self) -> InventorySnapshot:
        self._check()
        return views.inventory(self)

    def render(self, request: SubmitRequest) -> Rendering:
        """Nothing: a simulated job is sent as no script or manifest."""
        return None

    def submit(self, request: SubmitRequest) -> SubmitResult:
        self._check()
        existing = self.job(request.name)
        if existing is not None:
            return SubmitResult(request.name, existing.backend_id, adopted=True)
        pl = request.placement
        if pl.pool not in self.pools:
            raise ValueError(f"backend {self.name} has no pool {pl.pool}")
        spec = request.snapshot.spec
        duration = self._run_time(request)
        done = 0
        resuming = request.env.get(RESUME_ENV) or request.snapshot.resume_from
        if spec.checkpoint.resumable and resuming:
            done = self.checkpoints.get(request.job_id, 0)
            duration = max(1.0, duration - done)
        self._seq += 1
        job = Job(
            name=request.name,
            backend_id=f"{self.name}-{self._seq}",
            pool=pl.pool,
            replicas=spec.gang.replicas,
            gpus=spec.gang.gpus_per_replica,
            duration=duration,
            submitted=self._t,
            isthmus=True,
            limit=float(spec.max_runtime),
            job_id=request.job_id,
            attempt=request.attempt,
            level=pl.topology_level.value if pl.topology_level else None,
            wanted=pl.nodes,
            exclude=frozenset(pl.exclude_nodes) if self.pools[pl.pool].excludes_nodes
            else frozenset(),
            seq=self._seq,
            fault=faults.from_annotations(spec.annotations, request.attempt),
            done_before=float(done),
        )
        token = request.env.get(PROGRESS_TOKEN_ENV) if self.reporter is not None else None
        ckpt = spec.checkpoint
        if token or (ckpt.dir and ckpt.interval):
            job.report = Reporting(request.job_id, request.attempt, token, self.progress_every,
                                   ckpt.dir, ckpt.interval)
            self._reporting[job.name] = job
        self.jobs[job.name] = job
        self.pending[job.pool].append(job)
        self.schedule(job.pool)
        return SubmitResult(job.name, job.backend_id, adopted=False)

    def _run_time(self, request: SubmitRequest) -> float:
        """Simulated seconds of work: ISTHMUS_SIM_DURATION in the env, else the spec's
        `isthmus.io/sim-duration`, else `runtime_fraction` of max_runtime, else a draw."""
        spec = request.snapshot.spec
        raw = request.env.get(DURATION_ENV) or spec.env.get(DURATION_ENV)
        if raw is not None:
            return float(raw)
        text = spec.annotations.get(DURATION_ANNOTATION)
        if text is not None:
            try:
                return float(parse_duration(text.strip()))
            except ValueError:
                pass  # accepted by the API, meaningless here: fall through
        if self.runtime_fraction is not None:
            return max(1.0, spec.max_runtime * self.runtime_fraction)
        return self._duration(self.rng)

    def job(self, name: str) -> Job | None:
        """The job of that name, among the jobs or in the accounting."""
        job = self.jobs.get(name)
        return job if job is not None else self.accounting.get(name)

    def lookup(self, name: str) -> Fact | None:
        self._check()
        job = self.job(name)
        return views.fact(self, job) if job else None

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]:
        """A synthetic log per rank (backends.base LogReader): see views.rank_logs."""
        self._check()
        job = self.job(name)
        return views.rank_logs(self, job, rank, tail) if job else []

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        self._check()
        job = self.job(name)
        if job is None:
            return CancelResult(name, found=False, signalled=False, message="no such job")
        if job.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.PREEMPTED):
            return CancelResult(name, found=True, signalled=False, message="already ended")
        running = job.started is not None
        self._end(job, Phase.CANCELLED, Reason.CancelledByUser, "cancelled")
        return CancelResult(name, found=True, signalled=running and grace_seconds > 0)

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        """Every Isthmus job, and each of `names` unknown here as LOST; the facts are built
        when read (views.observed): the reconciler reads the phases and reasons of all and
        the facts of the few that changed."""
        self._check()
        return views.observed(self, names)

    # ---- time ---------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        """Move the shared clock and process events up to it."""
        self.clock.advance(dt)
        self.sync()

    def sync(self) -> None:
        """Process ends, failures and external arrivals up to the clock's time, in order."""
        target = self.clock.t
        while True:
            t_end = self._ends[0][0] if self._ends else float("inf")
            t_ext = self._next_external
            t = min(t_end, t_ext)
            if t > target:
                break
            self._t = t
            if t_end <= t_ext:
                _, seq, name = heapq.heappop(self._ends)
                job = self.jobs.get(name)
                # else ended early (cancelled, failed) and retired since, and perhaps its
                # name submitted again: that later job is not this entry's
                if job is not None and job.seq == seq:
                    self._finish(job)
            else:
                foreign.arrive(self)
                self._next_external = foreign.next_arrival(self, t)
        self._t = target
        # every call of the backend syncs (a lookup and a submit per dispatched job): a pass
        # over every running job each time was a third of the simulator's CPU under the soak
        if self._reporting and self._t - self._scanned >= min(1.0, self.progress_every / 4):
            self._scanned = self._t
            self._progress()
        self._retire()

    def _retire(self) -> None:
        """Jobs ended `retention_s` ago leave the jobs: an Isthmus one for the accounting."""
        horizon = self._t - self.retention_s
        while self._ended and self._ended[0][0] <= horizon:
            _, seq, name = self._ended.popleft()
            job = self.jobs.get(name)
            if job is None or job.seq != seq:
                continue  # removed by hand (a test), or its name submitted again since
            del self.jobs[name]
            if job.isthmus:
                self.accounting[name] = job
                if len(self.accounting) > ACCOUNTING_MAX:  # the oldest: first inserted
                    del self.accounting[next(iter(self.accounting))]

    def _progress(self) -> None:
        """Progress reports and checkpoints of the jobs that run now (progress.py)."""
        for job in list(self._reporting.values()):
            self._progress_of(job)

    def _progress_of(self, job: Job, send: bool = True) -> None:
        """One job's report (unless not `send`) and checkpoint due now."""
        rep = job.report
        if rep is None or job.started is None:
            return
        worked = self._t - job.started - self.failures.start_delay_s
        if worked < 0 or job.phase is not Phase.RUNNING:
            return
        step = int(job.done_before + worked)
        report, path = rep.due(self._t, step)
        if path is not None:
            self.checkpoints[rep.job_id] = rep.last_checkpoint
        if send and report and self.reporter is not None and rep.token is not None:
            self.reporter.send(Report(rep.job_id, rep.token, step, path,
                                      running=partial(_runs, job)))

    def drain_events(self) -> list[tuple[str, str]]:
        """(name, "start" | "end") of Isthmus jobs since the last call, in order: lets a
        simulation driver look up only what changed instead of observing everything."""
        if self._events is None:
            raise RuntimeError(f"{self.name} keeps no events: construct it with events=True")
        out = list(self._events)
        self._events.clear()
        return out

    # ---- failure injection --------------------------------------------------------------
    def fail_node(self, name: str) -> None:
        node = self.nodes[name]
        node.up = False
        node.snap = None
        for job in list(self.jobs.values()):
            if job.phase in (Phase.RUNNING, Phase.STARTING) and name in job.nodes:
                self._end(
                    job,
                    Phase.FAILED,
                    FAILURE_REASON[FailureCategory.INFRA_TRANSIENT],
                    f"node {name} failed",
                    FailureCategory.INFRA_TRANSIENT,
                )
                job.bad_nodes = (name,)

    def preempt(self, name: str) -> None:
        """Preemption by the backend itself (e.g. a higher-priority partition)."""
        self._end(self.jobs[name], Phase.PREEMPTED, Reason.Preempted, "preempted by backend")

    # ---- internals ----------------------------------------------------------------------
    def foreign_job(self, pool: str, replicas: int, gpus: int, duration: float,
                    limit: float | None, wanted: tuple[str, ...] = ()) -> Job:
        """A job that is not Isthmus's (foreign.py), not queued yet."""
        self._seq += 1
        return Job(name=f"foreign-{self._seq}", backend_id=f"{self.name}-{self._seq}", pool=pool,
                   replicas=replicas, gpus=gpus, duration=duration, submitted=self._t,
                   isthmus=False, limit=limit, seq=self._seq, wanted=wanted)

    def enqueue(self, job: Job, schedule: bool = True) -> None:
        self.jobs[job.name] = job
        self.pending[job.pool].append(job)
        if schedule:
            self.schedule(job.pool)

    def schedule(self, pool: str) -> None:
        queue = self.pending[pool]
        started: list[Job] = []
        for job in queue:
            nodes = fit_nodes(self.nodes, self.pool_nodes, job)
            if nodes is None:
                continue
            for n in nodes:
                n.free -= job.gpus
                n.running[job.name] = n.running.get(job.name, 0) + job.gpus
                n.snap = None
            job.nodes = tuple(n.name for n in nodes)
            job.started = self._t
            job.phase = Phase.RUNNING
            job.reason = Reason.Running
            run = self.failures.start_delay_s + job.duration
            if job.isthmus and job.fault is None and self.failures.fault_rates:
                job.fault = faults.draw(self.failures.fault_rates, self.rng)
            if job.fault is not None:
                job.failure = job.fault.category
                run = job.fault.strikes_after(self.failures.start_delay_s, job.duration, self.rng)
            elif job.isthmus and self.rng.random() < self.failures.job_failure_rate:
                cats, weights = zip(*self.failures.categories, strict=True)
                job.failure = self.rng.choices(cats, weights)[0]
                run = self.failures.start_delay_s + job.duration * self.rng.random()
            heapq.heappush(self._ends, (self._t + run, job.seq, job.name))
            started.append(job)
            if job.isthmus and self._events is not None:
                self._events.append((job.name, "start"))
        if started:
            done = {j.name for j in started}
            self.pending[pool] = [j for j in queue if j.name not in done]

    def _finish(self, job: Job) -> None:
        if job.phase not in (Phase.RUNNING, Phase.STARTING):
            return  # ended earlier (cancelled, node failure); its heap entry is stale
        if job.fault is not None:
            node = job.nodes[0] if job.nodes else "?"
            self._end(job, Phase.FAILED, FAILURE_REASON[job.fault.category],
                      job.fault.message(node), job.fault.category)
            if job.fault is faults.Fault.NODE_LOSS:
                job.bad_nodes = (node,)
        elif job.failure is not None:
            node = job.nodes[0] if job.nodes else "?"
            self._end(
                job,
                Phase.FAILED,
                FAILURE_REASON[job.failure],
                f"injected {job.failure.value} on {node}",
                job.failure,
            )
        else:
            self._end(job, Phase.SUCCEEDED, Reason.Succeeded, "exit 0")

    def _end(
        self,
        job: Job,
        phase: Phase,
        reason: Reason,
        message: str,
        failure: FailureCategory | None = None,
    ) -> None:
        if job.started is not None and job.ended is None:
            for name in job.nodes:
                n = self.nodes[name]
                n.free += job.gpus
                n.running.pop(job.name, None)
                n.snap = None
        elif job in self.pending[job.pool]:
            self.pending[job.pool].remove(job)
        if job.ended is None:
            self._ended.append((self._t, job.seq, job.name))
        if job.name in self._reporting:  # a checkpoint written since the last pass is kept
            self._progress_of(job, send=False)
        job.phase, job.reason, job.message, job.ended = phase, reason, message, self._t
        self._reporting.pop(job.name, None)
        job.failure = failure
        if job.isthmus and self._events is not None:
            self._events.append((job.name, "end"))
        self.schedule(job.pool)


