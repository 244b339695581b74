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
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from backends.base import (
    BackendUnavailable,
    CancelResult,
    Capability,
    RankLog,
    SubmitRequest,
    SubmitResult,
    tail_lines,
)
from broker.domain.facts import Fact, Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import (
    InventorySnapshot,
    NodeSnapshot,
    PoolSnapshot,
    QueueDepth,
    TopologyPath,
)
from broker.domain.reasons import FAILURE_REASON, Reason
from broker.domain.spec import BackendKind

DURATION_ENV = "ISTHMUS_SIM_DURATION"
"""SubmitRequest.env key: the job's run time in seconds (else a seeded draw)."""


class SimClock:
    """Virtual time shared by several simulated backends."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.t = 0.0

    @property
    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.t)

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError("virtual time only moves forward")
        self.t += dt


@dataclass(frozen=True, slots=True)
class SimPoolSpec:
    name: str
    flavor: str
    blocks: int = 1
    racks_per_block: int = 2
    nodes_per_rack: int = 4
    gpus_per_node: int = 8
    cost_weight: float = 1.0
    shared: bool = True
    max_isthmus_pending: int | None = None

    @property
    def nodes(self) -> int:
        return self.blocks * self.racks_per_block * self.nodes_per_rack


@dataclass(frozen=True, slots=True)
class SimFailures:
    job_failure_rate: float = 0.0
    """Probability that an attempt fails part-way."""
    categories: tuple[tuple[FailureCategory, float], ...] = (
        (FailureCategory.INFRA_TRANSIENT, 0.6),
        (FailureCategory.USER_ERROR, 0.3),
        (FailureCategory.RESOURCE_ENV, 0.1),
    )
    start_delay_s: float = 30.0
    """Time from allocation until every rank runs (image pull, rendezvous)."""


@dataclass(frozen=True, slots=True)
class ExternalLoad:
    """Work submitted to the backend directly (not through Isthmus)."""

    arrivals_per_hour: float = 0.0
    gpus: tuple[int, ...] = (1, 2, 4, 8, 16)
    mean_duration_s: float = 3600.0
    limit_s: float | None = None
    """Declared time limit of each external job (None: the backend knows no end)."""


@dataclass(slots=True)
class _Job:
    name: str
    backend_id: str
    pool: str
    replicas: int
    gpus: int
    duration: float
    submitted: float
    isthmus: bool
    limit: float | None = None
    """Declared time limit in seconds (what the scheduler knows), not the true duration."""
    job_id: str | None = None
    attempt: int | None = None
    level: str | None = None
    wanted: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    started: float | None = None
    ended: float | None = None
    phase: Phase = Phase.PENDING
    failure: FailureCategory | None = None
    fail_after: float | None = None
    seq: int = 0
    reason: Reason = Reason.BackendPending
    message: str = ""
    bad_nodes: tuple[str, ...] = ()


@dataclass(slots=True)
class _Node:
    name: str
    pool: str
    total: int
    free: int
    topo: TopologyPath
    up: bool = True
    snap: NodeSnapshot | None = field(default=None, repr=False)
    running: dict[str, int] = field(default_factory=dict)
    """GPUs each running job holds here, by job name."""


class SimBackend:
    """Implements backends.base.Backend; see the module docstring."""

    capabilities = (
        Capability.GANG | Capability.TOPOLOGY | Capability.QUEUE_DEPTH | Capability.ACCOUNTING
    )

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
    ) -> None:
        self.name = name
        self.report_releases = releases
        """False: the inventory reports no releases, like a backend that cannot tell."""
        self.kind = kind
        self.clock = clock
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not secrets
        self.failures = failures or SimFailures()
        self.external = external or ExternalLoad()
        self._duration = duration or (lambda r: r.lognormvariate(7.5, 1.5))
        self.reachable = True
        self.pools = {p.name: p for p in pools}
        self.nodes: dict[str, _Node] = {}
        self.pool_nodes: dict[str, list[_Node]] = {}
        for p in pools:
            lst = self.pool_nodes[p.name] = []
            i = 0
            for b in range(p.blocks):
                for r in range(p.racks_per_block):
                    for _ in range(p.nodes_per_rack):
                        topo = TopologyPath(block=f"{p.name}-b{b}", rack=f"r{r}")
                        node = _Node(
                            f"{p.name}-n{i:04d}", p.name, p.gpus_per_node, p.gpus_per_node, topo
                        )
                        self.nodes[node.name] = node
                        lst.append(node)
                        i += 1
        self.jobs: dict[str, _Job] = {}
        self.pending: dict[str, list[_Job]] = {p: [] for p in self.pools}
        self._ends: list[tuple[float, int, str]] = []
        self._seq = 0
        self._events: list[tuple[str, str]] = []
        self._t = clock.t
        self._next_external = self._draw_arrival(self._t)

    # ---- the Backend protocol ---------------------------------------------------------
    def _check(self) -> None:
        if not self.reachable:
            raise BackendUnavailable(f"simulated backend {self.name} is unreachable")

    def inventory(self) -> InventorySnapshot:
        self._check()
        pools = []
        for name, spec in self.pools.items():
            nodes = []
            for n in self.pool_nodes[name]:
                if n.snap is None:
                    n.snap = NodeSnapshot.model_construct(
                        name=n.name,
                        total_gpus=n.total,
                        free_gpus=n.free if n.up else 0,
                        cpus=0,
                        free_cpus=0,
                        memory_bytes=0,
                        free_memory_bytes=0,
                        topology=n.topo,
                        schedulable=n.up,
                        reason=None if n.up else "down",
                        releases=self._releases(n),
                    )
                nodes.append(n.snap)
            pools.append(
                PoolSnapshot.model_construct(
                    name=name,
                    backend_kind=BackendKind(self.kind),
                    backend=self.name,
                    flavor=spec.flavor,
                    selector=name,
                    cost_weight=spec.cost_weight,
                    shared=spec.shared,
                    drained=False,
                    max_isthmus_pending=spec.max_isthmus_pending,
                    nodes=tuple(nodes),
                    queue=self._queue_depth(name),
                )
            )
        return InventorySnapshot(taken_at=self.clock.now, pools=tuple(pools))

    def _releases(self, node: _Node) -> tuple[tuple[datetime, int], ...]:
        if not self.report_releases:
            return ()
        out = []
        for name, gpus in node.running.items():
            job = self.jobs[name]
            if job.limit is not None and job.started is not None:
                out.append((job.started + job.limit, gpus))
        return tuple((self.clock.at(t), g) for t, g in sorted(out))

    def _queue_depth(self, pool: str) -> QueueDepth:
        mine = [j for j in self.pending[pool] if j.isthmus]
        foreign = sum(j.gpus * j.replicas for j in self.pending[pool] if not j.isthmus)
        total = sum(n.total for n in self.pool_nodes[pool]) or 1
        pend = sum(j.gpus * j.replicas for j in mine) + foreign
        return QueueDepth(
            isthmus_pending_gpus=pend - foreign,
            foreign_pending_gpus=foreign,
            isthmus_pending_jobs=len(mine),
            expected_wait_seconds=pend / total * self.external.mean_duration_s,
        )

    def submit(self, request: SubmitRequest) -> SubmitResult:
        self._check()
        existing = self.jobs.get(request.name)
        if existing is not None:
            return SubmitResult(request.name, existing.backend_id, adopted=True)
        pl = request.placement
        if pl.pool not in self.pools:
            raise ValueError(f"backend {self.name} has no pool {pl.pool}")
        gang = request.snapshot.spec.gang
        raw = request.env.get(DURATION_ENV) or request.snapshot.spec.env.get(DURATION_ENV)
        duration = float(raw) if raw is not None else self._duration(self.rng)
        self._seq += 1
        job = _Job(
            name=request.name,
            backend_id=f"{self.name}-{self._seq}",
            pool=pl.pool,
            replicas=gang.replicas,
            gpus=gang.gpus_per_replica,
            duration=duration,
            submitted=self._t,
            isthmus=True,
            limit=float(request.snapshot.spec.max_runtime),
            job_id=request.job_id,
            attempt=request.attempt,
            level=pl.topology_level.value if pl.topology_level else None,
            wanted=pl.nodes,
            seq=self._seq,
        )
        self.jobs[job.name] = job
        self.pending[job.pool].append(job)
        self._schedule(job.pool)
        return SubmitResult(job.name, job.backend_id, adopted=False)

    def lookup(self, name: str) -> Fact | None:
        self._check()
        job = self.jobs.get(name)
        return self._fact(job) if job else None

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]:
        """A synthetic log per rank from what the simulator knows of the job (backends.base
        LogReader): where and when each rank started, and how the job ended."""
        self._check()
        job = self.jobs.get(name)
        if job is None:
            return []
        out = []
        for r in range(job.replicas) if rank is None else [rank]:
            if not 0 <= r < job.replicas:
                continue
            lines = [f"{self.clock.at(job.submitted).isoformat()} rank {r}: queued in {job.pool}"]
            if job.started is not None:
                node = job.nodes[r] if r < len(job.nodes) else "?"
                lines.append(f"{self.clock.at(job.started).isoformat()} rank {r}: started on "
                             f"{node} with {job.gpus} GPUs")
            if job.ended is not None:
                lines.append(f"{self.clock.at(job.ended).isoformat()} rank {r}: "
                             f"{job.phase.value.lower()} {job.message}".rstrip())
            text = tail_lines("\n".join(lines) + "\n", tail)
            out.append(RankLog(r, text, f"simulator {self.name}"))
        return out

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        self._check()
        job = self.jobs.get(name)
        if job is None:
            return CancelResult(name, found=False, signalled=False, message="no such job")
        if job.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.PREEMPTED):
            return CancelResult(name, found=True, signalled=False, message="already ended")
        running = job.started is not None
        self._end(job, Phase.CANCELLED, Reason.CancelledByUser, "cancelled")
        return CancelResult(name, found=True, signalled=running and grace_seconds > 0)

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        self._check()
        facts = [self._fact(j) for j in self.jobs.values() if j.isthmus]
        for n in names or ():
            if n not in self.jobs:
                facts.append(
                    Fact(
                        backend=self.name,
                        backend_name=n,
                        phase=Phase.LOST,
                        reason=Reason.Orchestration,
                        observed_at=self.clock.now,
                        message="unknown to the simulated backend",
                    )
                )
        return facts

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
                _, _, name = heapq.heappop(self._ends)
                self._finish(self.jobs[name])
            else:
                self._arrive_external()
                self._next_external = self._draw_arrival(t)
        self._t = target

    def drain_events(self) -> list[tuple[str, str]]:
        """(name, "start" | "end") of Isthmus jobs since the last call, in order: lets a
        simulation driver look up only what changed instead of observing everything."""
        out, self._events = self._events, []
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

    def restore_node(self, name: str) -> None:
        node = self.nodes[name]
        node.up = True
        node.snap = None
        self._schedule(node.pool)

    def preempt(self, name: str) -> None:
        """Preemption by the backend itself (e.g. a higher-priority partition)."""
        self._end(self.jobs[name], Phase.PREEMPTED, Reason.Preempted, "preempted by backend")

    # ---- internals ----------------------------------------------------------------------
    def _draw_arrival(self, t: float) -> float:
        rate = self.external.arrivals_per_hour
        return t + self.rng.expovariate(rate / 3600.0) if rate > 0 else float("inf")

    def _arrive_external(self) -> None:
        pool = self.rng.choice(sorted(self.pools))
        width = self.pools[pool].gpus_per_node
        gpus = self.rng.choice(self.external.gpus)
        replicas, per = (gpus // width, width) if gpus > width else (1, gpus)
        self._seq += 1
        job = _Job(
            name=f"foreign-{self._seq}",
            backend_id=f"{self.name}-{self._seq}",
            pool=pool,
            replicas=replicas,
            gpus=per,
            duration=self.rng.expovariate(1.0 / self.external.mean_duration_s),
            submitted=self._t,
            isthmus=False,
            limit=self.external.limit_s,
            seq=self._seq,
        )
        self.jobs[job.name] = job
        self.pending[pool].append(job)
        self._schedule(pool)

    def _fits(self, job: _Job) -> list[_Node] | None:
        if job.wanted and len(job.wanted) == job.replicas:
            need: dict[str, int] = {}
            for wanted in job.wanted:
                need[wanted] = need.get(wanted, 0) + job.gpus
            if all(
                (nd := self.nodes.get(w)) is not None and nd.up and nd.free >= k
                for w, k in need.items()
            ):
                return [self.nodes[w] for w in job.wanted]
        groups: dict[str, list[_Node]] = {}
        for n in self.pool_nodes[job.pool]:
            if n.up and n.free >= job.gpus:
                key = n.topo.domain(job.level, n.name) if job.level else ""
                groups.setdefault(key, []).append(n)
        for key in sorted(groups):
            out: list[_Node] = []
            for n in groups[key]:
                out.extend([n] * min(n.free // job.gpus, job.replicas - len(out)))
                if len(out) == job.replicas:
                    return out
        return None

    def _schedule(self, pool: str) -> None:
        queue = self.pending[pool]
        started: list[_Job] = []
        for job in queue:
            nodes = self._fits(job)
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
            if job.isthmus and self.rng.random() < self.failures.job_failure_rate:
                cats, weights = zip(*self.failures.categories, strict=True)
                job.failure = self.rng.choices(cats, weights)[0]
                run = self.failures.start_delay_s + job.duration * self.rng.random()
            heapq.heappush(self._ends, (self._t + run, job.seq, job.name))
            started.append(job)
            if job.isthmus:
                self._events.append((job.name, "start"))
        if started:
            done = {j.name for j in started}
            self.pending[pool] = [j for j in queue if j.name not in done]

    def _finish(self, job: _Job) -> None:
        if job.phase not in (Phase.RUNNING, Phase.STARTING):
            return  # ended earlier (cancelled, node failure); its heap entry is stale
        if job.failure is not None:
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
        job: _Job,
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
        job.phase, job.reason, job.message, job.ended = phase, reason, message, self._t
        job.failure = failure
        if job.isthmus:
            self._events.append((job.name, "end"))
        self._schedule(job.pool)

    def _fact(self, job: _Job) -> Fact:
        phase = job.phase
        started = job.started
        if phase is Phase.RUNNING and started is not None:
            phase = Phase.STARTING if self._t < started + self.failures.start_delay_s else phase
        reason = Reason.WaitingForAllRanks if phase is Phase.STARTING else job.reason
        return Fact(
            backend=self.name,
            backend_name=job.name,
            backend_id=job.backend_id,
            job_id=job.job_id,
            attempt=job.attempt,
            phase=phase,
            reason=reason,
            failure=job.failure,
            raw_state=phase.value,
            message=job.message,
            nodes=tuple(dict.fromkeys(job.nodes)),
            bad_nodes=job.bad_nodes,
            submitted_at=self.clock.at(job.submitted),
            started_at=self.clock.at(job.started) if job.started is not None else None,
            ended_at=self.clock.at(job.ended) if job.ended is not None else None,
            observed_at=self.clock.now,
        )
