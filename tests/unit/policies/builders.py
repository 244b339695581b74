"""Readable builders for policy tests: make_job().gpus(8).replicas(4).build(),
make_pool("slurm-h100").racks(2, nodes=4).build(), quota_config(...)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.domain.inventory import (
    InventorySnapshot,
    NodeSnapshot,
    PoolSnapshot,
    QueueDepth,
    TopologyPath,
)
from broker.domain.spec import BackendKind
from broker.domain.topology import TopologyLevel
from policies.capacity import POOL, PoolIndex
from policies.cycle import pool_room
from policies.types import (
    FlavorQuota,
    PendingJob,
    PoolRoom,
    QuotaConfig,
    RunningJob,
    TeamQuota,
    Usage,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
_counter = [0]


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


class JobBuilder:
    def __init__(self) -> None:
        _counter[0] += 1
        self.job = PendingJob(
            id=f"job{_counter[0]:05d}",
            team="vision",
            replicas=1,
            gpus_per_replica=1,
            flavors=("h100",),
            submitted_at=T0,
            priority=100,
        )

    def id(self, v: str) -> JobBuilder:
        return self._set(id=v)

    def gpus(self, n: int) -> JobBuilder:
        return self._set(gpus_per_replica=n)

    def replicas(self, n: int) -> JobBuilder:
        return self._set(replicas=n)

    def team(self, t: str) -> JobBuilder:
        return self._set(team=t)

    def flavors(self, *f: str) -> JobBuilder:
        return self._set(flavors=tuple(f))

    def priority(self, p: int, preempting: bool = False) -> JobBuilder:
        return self._set(priority=p, can_preempt=preempting)

    def topology(self, required: str | None, preferred: str | None = None) -> JobBuilder:
        return self._set(
            topology_required=TopologyLevel(required) if required else None,
            topology_preferred=TopologyLevel(preferred) if preferred else None,
        )

    def backend(self, kind: str) -> JobBuilder:
        return self._set(backend=kind)

    def submitted(self, minutes: float) -> JobBuilder:
        return self._set(submitted_at=at(minutes))

    def exclude_pools(self, *p: str) -> JobBuilder:
        return self._set(exclude_pools=frozenset(p))

    def exclude_nodes(self, *n: str) -> JobBuilder:
        return self._set(exclude_nodes=frozenset(n))

    def not_before(self, minutes: float) -> JobBuilder:
        return self._set(not_before=at(minutes))

    def memory(self, gib: int) -> JobBuilder:
        return self._set(memory_per_replica=gib * 2**30)

    def cpus(self, n: int) -> JobBuilder:
        return self._set(cpus_per_replica=n)

    def one_per_node(self) -> JobBuilder:
        return self._set(one_per_node=True)

    def image(self, ref: str) -> JobBuilder:
        return self._set(image=ref)

    def _set(self, **kw: Any) -> JobBuilder:
        self.job = replace(self.job, **kw)
        return self

    def build(self) -> PendingJob:
        return self.job


def make_job() -> JobBuilder:
    return JobBuilder()


class PoolBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.flavor = "h100"
        self.kind = BackendKind.SLURM
        self.backend = "slurm-a"
        self.blocks = 1
        self.racks_per_block = 2
        self.nodes_per_rack = 4
        self.gpus = 8
        self.used: dict[str, int] = {}
        self.down: set[str] = set()
        self.kw: dict[str, Any] = {}
        self.queue = QueueDepth()
        self.cpus = 0
        self.memory = 0
        self.releases: dict[str, tuple[tuple[datetime, int], ...]] = {}

    def flavor_(self, f: str) -> PoolBuilder:
        self.flavor = f
        return self

    def on(self, backend: str, kind: str = "slurm") -> PoolBuilder:
        self.backend, self.kind = backend, BackendKind(kind)
        return self

    def shape(self, blocks: int = 1, racks: int = 2, nodes: int = 4, gpus: int = 8) -> PoolBuilder:
        self.blocks, self.racks_per_block, self.nodes_per_rack, self.gpus = (
            blocks,
            racks,
            nodes,
            gpus,
        )
        return self

    def use(self, node: str, gpus: int) -> PoolBuilder:
        """Mark `gpus` GPUs of node `node` (e.g. 'n0') as busy."""
        self.used[node] = gpus
        return self

    def run(self, *jobs: RunningJob) -> PoolBuilder:
        """Mark the GPUs of running jobs busy on their nodes (gpus / len(nodes) per entry)."""
        for j in jobs:
            for n in j.nodes:
                self.used[n] = self.used.get(n, 0) + j.gpus // len(j.nodes)
        return self

    def release(self, node: str, *ends: tuple[float, int]) -> PoolBuilder:
        """Busy GPUs of `node` ('n0') expected back: (minutes from T0, GPUs) per entry. The
        node's busy GPUs are set to cover them unless `use` already said more."""
        self.releases[node] = tuple((at(m), g) for m, g in ends)
        self.used[node] = max(self.used.get(node, 0), sum(g for _, g in ends))
        return self

    def use_all_but(self, free: dict[str, int]) -> PoolBuilder:
        for n in self.node_names():
            self.used[n] = self.gpus - free.get(n, 0)
        return self

    def down_(self, *nodes: str) -> PoolBuilder:
        self.down.update(nodes)
        return self

    def with_cpus(self, cpus: int) -> PoolBuilder:
        self.cpus = cpus
        return self

    def with_memory(self, gib: int) -> PoolBuilder:
        self.memory = gib * 2**30
        return self

    def set(self, **kw: Any) -> PoolBuilder:
        self.kw.update(kw)
        return self

    def pending(
        self, isthmus_jobs: int = 0, foreign_gpus: int = 0, wait: float | None = None
    ) -> PoolBuilder:
        self.queue = QueueDepth(
            isthmus_pending_jobs=isthmus_jobs,
            foreign_pending_gpus=foreign_gpus,
            expected_wait_seconds=wait,
        )
        return self

    def node_names(self) -> list[str]:
        return [
            f"{self.name}-n{i}"
            for i in range(self.blocks * self.racks_per_block * self.nodes_per_rack)
        ]

    def build(self) -> PoolSnapshot:
        nodes = []
        i = 0
        for b in range(self.blocks):
            for r in range(self.racks_per_block):
                for _ in range(self.nodes_per_rack):
                    name = f"{self.name}-n{i}"
                    used = self.used.get(name, self.used.get(f"n{i}", 0))
                    releases = self.releases.get(name, self.releases.get(f"n{i}", ()))
                    nodes.append(
                        NodeSnapshot(
                            name=name,
                            total_gpus=self.gpus,
                            free_gpus=self.gpus - used,
                            cpus=self.cpus,
                            free_cpus=self.cpus,
                            memory_bytes=self.memory,
                            free_memory_bytes=self.memory,
                            topology=TopologyPath(block=f"b{b}", rack=f"r{b}{r}"),
                            schedulable=name not in self.down and f"n{i}" not in self.down,
                            releases=releases,
                        )
                    )
                    i += 1
        return PoolSnapshot(
            name=self.name,
            backend_kind=self.kind,
            backend=self.backend,
            flavor=self.flavor,
            nodes=tuple(nodes),
            queue=self.queue,
            **self.kw,
        )


def make_pool(name: str = "p1") -> PoolBuilder:
    return PoolBuilder(name)


def inventory(
    *pools: PoolSnapshot | PoolBuilder, unreachable: tuple[str, ...] = ()
) -> InventorySnapshot:
    built = tuple(p.build() if isinstance(p, PoolBuilder) else p for p in pools)
    return InventorySnapshot(taken_at=T0, pools=built, unreachable=unreachable)


def quota_config(
    teams: dict[str, tuple[str | None, dict[str, FlavorQuota]]],
    cost: dict[str, float] | None = None,
) -> QuotaConfig:
    return QuotaConfig(
        teams={n: TeamQuota(n, cohort, q) for n, (cohort, q) in teams.items()},
        flavor_cost=cost or {},
    )


def q(nominal: int, borrow: int | None = None, lend: int | None = None) -> FlavorQuota:
    return FlavorQuota(nominal, borrow, lend)


def usage(**in_use: int) -> Usage:
    """usage(vision__h100=8) -> in_use {("vision", "h100"): 8}."""
    return Usage(in_use={tuple(k.split("__")): v for k, v in in_use.items()})  # type: ignore[misc]


def running(
    id: str,
    team: str = "vision",
    gpus: int = 8,
    priority: int = 100,
    started: float = -120,
    checkpoint: float | None = None,
    end: float | None = None,
    borrowed: bool = False,
    flavor: str = "h100",
    pool: str = "p1",
    nodes: tuple[str, ...] = (),
) -> RunningJob:
    """`nodes` as placements record them (one entry per replica); 'n0' stands for 'p1-n0'."""
    return RunningJob(
        id=id,
        team=team,
        flavor=flavor,
        pool=pool,
        gpus=gpus,
        priority=priority,
        started_at=at(started),
        last_checkpoint_at=at(checkpoint) if checkpoint is not None else None,
        expected_end=at(end) if end is not None else None,
        borrowed=borrowed,
        nodes=tuple(n if n.startswith(f"{pool}-") else f"{pool}-{n}" for n in nodes),
    )


def room(pool: PoolBuilder, level: str | None = None, exclude: tuple[str, ...] = ()) -> PoolRoom:
    """What admission passes to priority preemption for a job requiring `level`."""
    rank = POOL if level is None else TopologyLevel(level).rank
    return pool_room(PoolIndex(pool.build()), rank, frozenset(exclude))
