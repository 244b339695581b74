"""What a simulated backend shows the broker: inventory snapshots (pools, nodes with their
expected releases, queue depth) and facts about jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from backends.base import Observed, RankLog, Said, said_of, tail_lines
from backends.sim.clock import SimClock
from backends.sim.model import ExternalLoad, Job, Node, SimFailures, SimPoolSpec
from broker.domain.facts import Fact, Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import (
    InventorySnapshot,
    NodeSnapshot,
    PoolSnapshot,
    QueueDepth,
    QueuedShape,
)
from broker.domain.reasons import Reason
from broker.domain.spec import BackendKind
from broker.domain.topology import TopologyLevel


class SimView(Protocol):
    """What these views read of a simulated backend (backend.SimBackend), declared here so
    that the views do not import the backend that uses them."""

    name: str
    kind: str
    clock: SimClock
    external: ExternalLoad
    failures: SimFailures
    report_releases: bool
    jobs: dict[str, Job]
    accounting: dict[str, Job]
    pending: dict[str, list[Job]]
    pools: dict[str, SimPoolSpec]
    pool_nodes: dict[str, list[Node]]

    @property
    def synced_t(self) -> float:
        """The simulated time the backend's state has been brought up to."""
        ...


def inventory(b: SimView) -> InventorySnapshot:
    """What the backend reports of its pools, nodes and queues now."""
    pools = []
    for name, spec in b.pools.items():
        nodes = []
        for n in b.pool_nodes[name]:
            if n.snap is None:
                n.snap = NodeSnapshot.model_construct(
                    name=n.name,
                    total_gpus=n.total,
                    free_gpus=n.free if n.up else 0,
                    cpus=spec.cpus_per_node,
                    free_cpus=share(spec.cpus_per_node, n),
                    memory_bytes=spec.memory_per_node,
                    free_memory_bytes=share(spec.memory_per_node, n),
                    topology=n.topo,
                    schedulable=n.up,
                    reason=None if n.up else "down",
                    releases=_releases(b, n),
                )
            nodes.append(n.snap)
        pools.append(
            PoolSnapshot.model_construct(
                name=name,
                backend_kind=BackendKind(b.kind),
                backend=b.name,
                flavor=spec.flavor,
                selector=name,
                cost_weight=spec.cost_weight,
                shared=spec.shared,
                drained=False,
                max_isthmus_pending=spec.max_isthmus_pending,
                excludes_nodes=spec.excludes_nodes,
                runs_images=spec.runs_images,
                nodes=tuple(nodes),
                queue=_queue_depth(b, name),
            )
        )
    return InventorySnapshot(taken_at=b.clock.now, pools=tuple(pools))


def _releases(b: SimView, node: Node) -> tuple[tuple[datetime, int], ...]:
    if not b.report_releases:
        return ()
    out = []
    for name, gpus in node.running.items():
        job = b.jobs[name]
        if job.limit is not None and job.started is not None:
            out.append((job.started + job.limit, gpus))
    return tuple((b.clock.at(t), g) for t, g in sorted(out))


MAX_SHAPES = 4096
"""Shapes reported per pool (QueueDepth's bound); GPUs of the rest are held whatever their
shape."""


def _queue_depth(b: SimView, pool: str) -> QueueDepth:
    mine = [j for j in b.pending[pool] if j.isthmus]
    foreign = sum(j.gpus * j.replicas for j in b.pending[pool] if not j.isthmus)
    total = sum(n.total for n in b.pool_nodes[pool]) or 1
    pend = sum(j.gpus * j.replicas for j in mine) + foreign
    return QueueDepth(
        isthmus_pending_gpus=pend - foreign,
        foreign_pending_gpus=foreign,
        isthmus_pending_jobs=len(mine),
        expected_wait_seconds=pend / total * b.external.mean_duration_s,
        isthmus_pending_shapes=tuple(
            QueuedShape(replicas=j.replicas, gpus_per_replica=j.gpus,
                        level=TopologyLevel(j.level) if j.level else None)
            for j in mine[:MAX_SHAPES] if j.gpus > 0
        ),
    )


def fact(b: SimView, job: Job) -> Fact:
    """What the backend says of one job now (STARTING until every rank runs)."""
    return _fact(b, job, _seen(b, job), b.clock.now)


_Seen = tuple[Phase, Reason, FailureCategory | None, str, tuple[str, ...], tuple[str, ...],
              float | None, float | None]
"""What of a job can change after it was observed: phase and reason as shown, failure,
message, nodes, blamed nodes, start, end."""


def _seen(b: SimView, job: Job) -> _Seen:
    phase = job.phase
    started = job.started
    if phase is Phase.RUNNING and started is not None:
        phase = Phase.STARTING if b.synced_t < started + b.failures.start_delay_s else phase
    reason = Reason.WaitingForAllRanks if phase is Phase.STARTING else job.reason
    return (phase, reason, job.failure, job.message, job.nodes, job.bad_nodes, started,
            job.ended)


def _fact(b: SimView, job: Job, seen: _Seen, now: datetime) -> Fact:
    phase, reason, failure, message, nodes, bad_nodes, started, ended = seen
    return Finding(
        phase=phase,
        reason=reason,
        failure=failure,
        raw_state=phase.value,
        message=message,
        nodes=tuple(dict.fromkeys(nodes)),
        bad_nodes=bad_nodes,
        submitted_at=b.clock.at(job.submitted),
        started_at=b.clock.at(started) if started is not None else None,
        ended_at=b.clock.at(ended) if ended is not None else None,
    ).fact(backend=b.name, backend_name=job.name, backend_id=job.backend_id,
           job_id=job.job_id, attempt=job.attempt, observed_at=now)


LOST = said_of(Phase.LOST, Reason.Orchestration, "")


def observed(b: SimView, names: Sequence[str] | None) -> Observed:
    """Every Isthmus job's phase and reason now, each of `names` from the accounting when it
    has left the jobs, and a LOST fact for each of `names` the backend does not know, as an
    `Observed`: a Fact is built only for the jobs a caller reads
    (from what the job was now, whatever it has become by then)."""
    now = b.clock.now
    said: dict[str, Said] = {}
    seen: dict[str, tuple[Job, _Seen]] = {}

    def note(job: Job) -> None:
        s = _seen(b, job)
        said[job.name] = said_of(s[0], s[1], s[3])
        seen[job.name] = (job, s)

    for job in b.jobs.values():
        if job.isthmus:
            note(job)
    for n in names or ():
        if n in b.jobs:
            continue
        old = b.accounting.get(n)  # ended: what it was then
        if old is None:
            said[n] = LOST
        else:
            note(old)

    def build(name: str) -> Fact:
        got = seen.get(name)
        if got is not None:
            return _fact(b, got[0], got[1], now)
        return Finding(Phase.LOST, Reason.Orchestration,
                       message="unknown to the simulated backend",
                       ).fact(backend=b.name, backend_name=name, observed_at=now)

    return Observed(said, build, now)


def share(total: int, node: Node) -> int:
    """Free CPUs or memory of a node, in proportion to its free GPUs (the simulator allocates
    GPUs; a job is taken to use its share of the rest)."""
    if not node.up or node.total == 0:
        return 0
    return total * node.free // node.total


def rank_logs(b: SimView, job: Job, rank: int | None, tail: int | None) -> list[RankLog]:
    """A synthetic log per rank from what the simulator knows of the job: where and when
    each rank started, and how the job ended."""
    out = []
    for r in range(job.replicas) if rank is None else [rank]:
        if not 0 <= r < job.replicas:
            continue
        lines = [f"{b.clock.at(job.submitted).isoformat()} rank {r}: queued in {job.pool}"]
        if job.started is not None:
            node = job.nodes[r] if r < len(job.nodes) else "?"
            lines.append(f"{b.clock.at(job.started).isoformat()} rank {r}: started on "
                         f"{node} with {job.gpus} GPUs")
        if job.ended is not None:
            lines.append(f"{b.clock.at(job.ended).isoformat()} rank {r}: "
                         f"{job.phase.value.lower()} {job.message}".rstrip())
        text = tail_lines("\n".join(lines) + "\n", tail)
        out.append(RankLog(r, text, f"simulator {b.name}"))
    return out
