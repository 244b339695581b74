"""Slurm nodes, switches and queue -> Isthmus pools (one per isthmus.yaml pool.partition)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from backends.slurm.classify import PendingCategory, pending_category
from backends.slurm.records import NodeRecord, SlurmJob, Switch
from broker.domain.inventory import NodeSnapshot, PoolSnapshot, QueueDepth, TopologyPath
from broker.domain.spec import BackendKind
from broker.domain.timebox import add_seconds

ISTHMUS_PREFIX = "isthmus-"
ISTHMUS_COMMENT = "isthmus,"
# Node states and flags in which Slurm will not start new work on a node.
UNSCHEDULABLE_STATES = {"down", "drained", "draining", "fail", "failing", "future", "unknown",
                        "error", "maint", "reboot", "power_down", "powered_down", "inval"}
UNSCHEDULABLE_FLAGS = {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "MAINTENANCE",
                       "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED",
                       "REBOOT_ISSUED", "INVALID_REG", "FUTURE"}
# Pending jobs that are not demand: held or deferred work (not yet), and other users' work
# that can never run as given (e.g. DependencyNeverSatisfied stays in the queue for good
# without kill_invalid_depend): counted, either would make a pool look busy for ever.
# Isthmus's own never-runnable jobs still count (they hold a place in the backend queue
# until the broker acts on their reason, and the pool's pending limit counts them).
# A job submitted to several partitions carries one reason, from whichever partition Slurm
# tried last: only reasons about the job itself, not a partition, rule it out everywhere.
JOB_WIDE_NEVER = frozenset({"DependencyNeverSatisfied", "InvalidAccount", "InvalidQOS"})
DEFAULT_RUNTIME_S = 3600.0  # for the wait estimate when nothing runs that we could measure


@dataclass(frozen=True, slots=True)
class SlurmPoolBinding:
    """An isthmus.yaml pool bound to a Slurm partition."""

    name: str
    partition: str
    flavor: str
    cost_weight: float = 1.0
    shared: bool = True
    drained: bool = False


def is_isthmus(job: SlurmJob) -> bool:
    return job.name.startswith(ISTHMUS_PREFIX) or job.comment.startswith(ISTHMUS_COMMENT)


def topology_paths(switches: Sequence[Switch]) -> dict[str, TopologyPath]:
    """Leaf switches are racks; the switch listing a rack is its block (e.g. the spine)."""
    parent: dict[str, str] = {}
    for sw in switches:
        for child in sw.switches:
            parent[child] = sw.name
    paths: dict[str, TopologyPath] = {}
    for sw in sorted(switches, key=lambda s: s.level):
        if sw.switches:  # not a leaf
            continue
        for node in sw.nodes:
            paths.setdefault(node, TopologyPath(block=parent.get(sw.name, ""), rack=sw.name))
    return paths


def unschedulable_reason(node: NodeRecord) -> str | None:
    bad_flags = sorted(node.flags & UNSCHEDULABLE_FLAGS)
    if node.state in UNSCHEDULABLE_STATES or bad_flags:
        what = "+".join([node.state, *(f.lower() for f in bad_flags)])
        return f"{what}: {node.reason}" if node.reason else what
    return None


def node_releases(jobs: Iterable[SlurmJob]) -> dict[str, list[tuple[datetime, int]]]:
    """When each node's busy GPUs are expected back: every running job's start plus its time
    limit (what Slurm's own backfill plans with), its GPUs spread evenly over its nodes. Jobs
    without a limit have no known end and are left out."""
    out: dict[str, list[tuple[datetime, int]]] = {}
    for job in jobs:
        if job.state != "RUNNING" or not job.nodes or not job.started_at or not job.time_limit_s:
            continue
        per_node = job.gpus // len(job.nodes)
        if per_node <= 0:
            continue
        end = add_seconds(job.started_at, job.time_limit_s)  # a limit may be absurd
        for name in job.nodes:
            out.setdefault(name, []).append((end, per_node))
    return out


def node_snapshot(node: NodeRecord, path: TopologyPath | None,
                  releases: Sequence[tuple[datetime, int]] = ()) -> NodeSnapshot:
    reason = unschedulable_reason(node)
    return NodeSnapshot(
        name=node.name,
        total_gpus=node.gpus,
        free_gpus=max(0, node.gpus - node.gpus_used),
        cpus=node.cpus,
        free_cpus=max(0, node.cpus - node.cpus_used),
        memory_bytes=node.memory_mb * 2**20,
        free_memory_bytes=max(0, node.memory_mb - node.memory_used_mb) * 2**20,
        topology=path or TopologyPath(),
        schedulable=reason is None,
        reason=reason,
        releases=tuple(sorted(releases)) if reason is None else (),
    )


def _demand(job: SlurmJob) -> bool:
    """Whether a pending job is demand in the partitions it lists."""
    category = pending_category(job.reason)
    if category is PendingCategory.HELD:
        return False  # held or deferred: not yet
    if category is not PendingCategory.NEVER or is_isthmus(job):
        return True
    return "," in job.partition and job.reason not in JOB_WIDE_NEVER


def queue_depth(partition: str, jobs: Iterable[SlurmJob], total_gpus: int,
                now: datetime) -> QueueDepth:
    """Pending GPU demand in a partition, ours and others', and a rough wait estimate.

    The estimate assumes the queue ahead drains at the rate running jobs free their GPUs:
    (pending GPUs / total GPUs) x mean remaining time limit of the running jobs. Time limits
    over-state run times, so it is an upper-leaning guess, good for ranking pools only.
    """
    ours = foreign = ours_jobs = 0
    remaining: list[float] = []
    for job in jobs:
        if partition not in job.partition.split(","):
            continue
        if job.state == "PENDING":
            if not _demand(job):
                continue
            if is_isthmus(job):
                ours += job.gpus
                ours_jobs += 1
            else:
                foreign += job.gpus
        elif job.state == "RUNNING" and job.time_limit_s and job.started_at:
            left = job.time_limit_s - (now - job.started_at).total_seconds()
            remaining.append(max(0.0, left))
    pending = ours + foreign
    if pending == 0:
        wait = 0.0
    else:
        per_turn = sum(remaining) / len(remaining) if remaining else DEFAULT_RUNTIME_S
        wait = pending / max(total_gpus, 1) * per_turn
    return QueueDepth(isthmus_pending_gpus=ours, foreign_pending_gpus=foreign,
                      isthmus_pending_jobs=ours_jobs, expected_wait_seconds=wait)


def pool_snapshots(
    backend: str,
    pools: Sequence[SlurmPoolBinding],
    nodes: Sequence[NodeRecord],
    switches: Sequence[Switch],
    jobs: Sequence[SlurmJob],
    now: datetime,
    excludes_nodes: bool = False,
    runs_images: bool = True,
) -> tuple[PoolSnapshot, ...]:
    paths = topology_paths(switches)
    releases = node_releases(jobs)
    result = []
    for pool in pools:
        members = [node_snapshot(n, paths.get(n.name), releases.get(n.name, ())) for n in nodes
                   if pool.partition in n.partitions]
        total = sum(n.total_gpus for n in members)
        result.append(PoolSnapshot(
            name=pool.name,
            backend_kind=BackendKind.SLURM,
            backend=backend,
            flavor=pool.flavor,
            selector=pool.partition,
            cost_weight=pool.cost_weight,
            shared=pool.shared,
            drained=pool.drained,
            excludes_nodes=excludes_nodes,
            runs_images=runs_images,
            nodes=tuple(members),
            queue=queue_depth(pool.partition, jobs, total, now),
        ))
    return tuple(result)


def split_name(name: str) -> tuple[str | None, int | None]:
    """'isthmus-<job>-<attempt>' -> (job, attempt); (None, None) for other names."""
    if not name.startswith(ISTHMUS_PREFIX):
        return None, None
    job, _, attempt = name[len(ISTHMUS_PREFIX):].rpartition("-")
    return (job or None), (int(attempt) if attempt.isdigit() else None)
