"""Two stronger baselines for bench/placement_quality.py, same strategy signature as Isthmus's.

Both see the same inventory snapshot Isthmus sees, place on the same pools of the same two
simulated backends, and keep the same gang semantics: all replicas start together, a gang that
asks for one rack is only ever placed (or queued) inside one rack, never spread.

- **greedy** (federated, SkyPilot-style): every job leaves the broker in the cycle it arrives.
  It goes to the cheapest acceptable pool where it fits now (flavor cost x pool cost weight;
  ties by the job's flavor preference, then pool order); if it fits nowhere now, to the
  acceptable pool with the shortest backend queue (pending GPUs / pool GPUs; ties cheapest).
  The simulated backend then runs its own queue: FIFO where any pending job that fits starts
  (backfill without reservations), first nodes with room inside the required rack.
- **kueue** (Kueue-like, one cohort over every pool): one FIFO queue per team (a ClusterQueue
  per team, BestEffortFIFO, ordered by priority then submit time), each with a nominal quota of
  1/8 of every pool's GPUs and unlimited borrowing in one cohort (so the cohort is exactly the
  physical capacity). A cycle takes one head per team queue, orders the heads Kueue's way
  (those that fit without borrowing first, then priority, then submit time) and admits each in
  the first of its acceptable pools (ResourceFlavors in a fixed order: the job's flavor order,
  Slurm-like then Kubernetes-like) where quota and topology allow, best-fit inside the pool
  (the fullest rack that holds the gang, fullest nodes first: Kueue TAS's BestFit). A head that
  fits nowhere is set aside until capacity is released (BestEffortFIFO) and the next workload
  of its team becomes the head. Cycles repeat within the same instant until no queue has a
  head left, as Kueue's scheduler loops back to back. No reservations, no preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.domain.attempts import Placement
from broker.domain.inventory import InventorySnapshot, PoolSnapshot
from broker.domain.spec import TopologyLevel
from policies.types import PendingJob, QuotaConfig, Usage


@dataclass
class _Pool:
    """A working copy of one pool's free GPUs per node and its backend queue."""

    snap: PoolSnapshot
    free: dict[str, int]
    rack: dict[str, str]
    queued_gpus: int

    @classmethod
    def of(cls, p: PoolSnapshot) -> _Pool:
        free = {n.name: n.free_gpus for n in p.nodes if n.schedulable}
        rack = {n.name: n.topology.rack for n in p.nodes}
        return cls(p, free, rack, p.queue.isthmus_pending_gpus + p.queue.foreign_pending_gpus)

    @property
    def total(self) -> int:
        return sum(n.total_gpus for n in self.snap.nodes) or 1

    def fit(self, job: PendingJob, best: bool) -> tuple[str, ...] | None:
        """Nodes for every replica now (one rack when the job requires it), or None. `best`:
        the fullest rack and fullest nodes that hold it (best fit); else first fit."""
        g = job.gpus_per_replica
        groups: dict[str, list[str]] = {}
        for name, f in self.free.items():
            if f >= g:
                key = self.rack[name] if job.topology_required is not None else ""
                groups.setdefault(key, []).append(name)
        options = []
        for key, names in groups.items():
            slots = sum(self.free[n] // g for n in names)
            if slots >= job.replicas:
                options.append((slots if best else 0, key, names))
        if not options:
            return None
        _, _, names = min(options, key=lambda o: (o[0], o[1]))
        if best:
            names = sorted(names, key=lambda n: (self.free[n], n))
        out: list[str] = []
        for n in names:
            out.extend([n] * min(self.free[n] // g, job.replicas - len(out)))
            if len(out) == job.replicas:
                return tuple(out)
        return None

    def take(self, job: PendingJob, nodes: tuple[str, ...]) -> None:
        for n in nodes:
            self.free[n] -= job.gpus_per_replica

    def placement(self, job: PendingJob, nodes: tuple[str, ...]) -> Placement:
        p = self.snap
        return Placement(
            backend=p.backend_kind,
            backend_instance=p.backend,
            pool=p.name,
            flavor=p.flavor,
            topology_level=TopologyLevel.RACK if job.topology_required is not None else None,
            nodes=nodes,
        )


def _acceptable(job: PendingJob, pools: list[_Pool]) -> list[_Pool]:
    return [p for p in pools if p.snap.flavor in job.flavors]


def greedy_strategy(quotas: QuotaConfig) -> Callable[..., list[tuple[str, Placement]]]:
    def cost(job: PendingJob, p: _Pool) -> tuple[float, int]:
        flavor = p.snap.flavor
        return quotas.flavor_cost.get(flavor, 1.0) * p.snap.cost_weight, job.flavors.index(flavor)

    def run(
        pending: list[PendingJob], inv: InventorySnapshot, usage: Usage, now: object
    ) -> list[tuple[str, Placement]]:
        pools = [_Pool.of(p) for p in inv.pools]
        out = []
        for job in sorted(pending, key=lambda j: (j.submitted_at, j.id)):
            cands = _acceptable(job, pools)
            fitting = [(cost(job, p), i, p) for i, p in enumerate(cands)]
            chosen = None
            for _, _, p in sorted(fitting, key=lambda t: (t[0], t[1])):
                nodes = p.fit(job, best=False)
                if nodes is not None:
                    p.take(job, nodes)
                    chosen = p.placement(job, nodes)
                    break
            if chosen is None:  # fits nowhere now: the shortest backend queue
                p = min(cands, key=lambda p: (p.queued_gpus / p.total, cost(job, p)))
                p.queued_gpus += job.total_gpus
                chosen = p.placement(job, ())
            out.append((job.id, chosen))
        return out

    return run


def kueue_strategy(
    quotas: QuotaConfig, teams: list[str]
) -> Callable[..., list[tuple[str, Placement]]]:
    order = {"slurm": 0, "k8s": 1}

    def run(
        pending: list[PendingJob], inv: InventorySnapshot, usage: Usage, now: object
    ) -> list[tuple[str, Placement]]:
        pools = sorted((_Pool.of(p) for p in inv.pools),
                       key=lambda p: (order.get(p.snap.backend_kind.value, 9), p.snap.name))
        # nominal: 1/8 of every flavor's GPUs per team; usage by team and flavor
        flavor_total: dict[str, int] = {}
        for p in pools:
            flavor_total[p.snap.flavor] = flavor_total.get(p.snap.flavor, 0) + p.total
        nominal = {f: t // max(1, len(teams)) for f, t in flavor_total.items()}
        used = dict(usage.in_use)
        queues: dict[str, list[PendingJob]] = {}
        for job in sorted(pending, key=lambda j: (-j.priority, j.submitted_at, j.id)):
            queues.setdefault(job.team, []).append(job)
        out: list[tuple[str, Placement]] = []
        while queues:
            heads = [(q[0], team) for team, q in queues.items()]
            for team in list(queues):
                queues[team].pop(0)
                if not queues[team]:
                    del queues[team]

            def borrows(job: PendingJob) -> bool:
                f = job.flavors[0]
                return used.get((job.team, f), 0) + job.total_gpus > nominal.get(f, 0)

            heads.sort(key=lambda h: (borrows(h[0]), -h[0].priority, h[0].submitted_at, h[0].id))
            for job, _ in heads:
                for flavor in job.flavors:
                    placed = False
                    for p in pools:
                        if p.snap.flavor != flavor:
                            continue
                        nodes = p.fit(job, best=True)
                        if nodes is not None:
                            p.take(job, nodes)
                            key = (job.team, flavor)
                            used[key] = used.get(key, 0) + job.total_gpus
                            out.append((job.id, p.placement(job, nodes)))
                            placed = True
                            break
                    if placed:
                        break
                # not placed: set aside (inadmissible) until capacity is released
        return out

    return run
