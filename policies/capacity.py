"""A mutable working copy of an inventory snapshot, indexed for fast gang fitting.

An admission cycle places thousands of gangs on thousands of nodes; scanning every node per job
is too slow. Each pool keeps, per rack, a histogram of nodes by free GPUs ("buckets"): the number
of g-GPU replicas a rack can hold is then sum(count[k] * (k // g)), a handful of operations,
cached per g until the rack changes. Pools also remember, per (gpus per replica, topology level),
the smallest replica count that failed this cycle: capacity only shrinks inside a cycle, so any
larger gang fails at once. Node lists are only walked inside the one domain finally chosen.

A starving gang's reservation goes to the domain where it would fit soonest, counting the GPUs
each node expects back (`NodeSnapshot.releases`, from declared time limits); without such data
anywhere in the pool it goes, as before, to the domain with the most free GPUs now.

Topology levels are ranked as broker/domain/topology.py encodes them (node, rack, block, pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from broker.domain.inventory import InventorySnapshot, PoolSnapshot
from broker.domain.topology import BLOCK, LEVEL_NAMES, NODE, POOL, RACK
from policies import reservation
from policies.reservation import HoldTarget
from policies.slots import NodeSlot, Rack, domain_name

__all__ = ["LEVEL_NAMES", "POOL", "RACK", "CapacityIndex", "Fit", "NodeCap", "NodeSlot",
           "PoolIndex", "domain_name"]

_BIG = 1 << 60


@dataclass(slots=True)
class Fit:
    """Where a gang fits: the level reached, the domain, and replicas per node."""

    level: int
    domain: str
    nodes: list[tuple[NodeSlot, int]]
    leftover: int
    """Free GPUs left in the chosen domain after placing the gang (best fit: smallest)."""


NodeCap = Callable[[NodeSlot], int]


@dataclass(slots=True)
class Exclusion:
    """Nodes held for starving gangs this cycle that jobs queued in the pool's backend must
    exclude (policies/queue_guard.py)."""

    nodes: set[str] = field(default_factory=set)
    holds: dict[str, str] = field(default_factory=dict)
    """The domain of each gang whose held nodes are in `nodes`, for reasons."""
    taken: set[str] = field(default_factory=set)
    """Nodes of every domain held for a gang this cycle, guarded or not."""
    caps: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """Replicas the largest domain outside `nodes` holds, per (GPUs, level, len(nodes))."""


class PoolIndex:
    """One pool of the working copy. Mutated only through `allocate` and `hold`."""

    def __init__(self, snap: PoolSnapshot) -> None:
        self.snap = snap
        self.name = snap.name
        self.flavor = snap.flavor
        width = max((n.total_gpus for n in snap.nodes), default=0)
        self.width = width
        racks: dict[tuple[str, str], Rack] = {}
        self.nodes: dict[str, NodeSlot] = {}
        self.buckets = [0] * (width + 1)
        self.free = 0
        self.total = 0
        self.unschedulable = 0
        self.has_releases = False
        # once per pool and cycle over every node: plain branches, no max/min calls (this
        # loop was a few per cent of the control loop, bench/loop_cost.py)
        buckets, slots = self.buckets, self.nodes
        pool_free = pool_total = unschedulable = 0
        has_releases = False
        most_gpus = most_cpus = most_memory = 0  # of the largest schedulable node
        for n in snap.nodes:
            topo = n.topology
            key = (topo.block, topo.rack)
            rack = racks.get(key)
            if rack is None:
                rack = racks[key] = Rack(key[0], key[1], width)
            if n.schedulable:
                total = n.total_gpus
                free = n.free_gpus
                if free > total:
                    free = total
                releases = n.releases
                if releases:
                    has_releases = True
                if total > most_gpus:
                    most_gpus = total
                if n.cpus > most_cpus:
                    most_cpus = n.cpus
                if n.memory_bytes > most_memory:
                    most_memory = n.memory_bytes
            else:
                total = free = 0
                releases = ()
                unschedulable += 1
            slot = NodeSlot(n.name, total, free, n.free_cpus if n.cpus else None,
                            n.free_memory_bytes if n.memory_bytes else None, rack, releases)
            rack.nodes.append(slot)
            rack.buckets[free] += 1
            rack.free += free
            rack.total += total
            if free > rack.max_free:
                rack.max_free = free
            buckets[free] += 1
            pool_free += free
            pool_total += total
            slots[n.name] = slot
        self.free, self.total = pool_free, pool_total
        self.unschedulable, self.has_releases = unschedulable, has_releases
        self.racks = sorted(racks.values(), key=lambda r: r.key)
        self.blocks: dict[str, list[Rack]] = {}
        for r in self.racks:
            self.blocks.setdefault(r.block, []).append(r)
        self.start_free = self.free
        self.fail_memo: dict[tuple[int, int], int] = {}
        self._static: dict[tuple[int, int], int] = {}
        # the largest schedulable node's GPUs, CPUs and memory (0: not reported)
        self.max_node_total, self.max_node_cpus, self.max_node_memory = \
            most_gpus, most_cpus, most_memory
        # bookkeeping of this cycle, read by admission for reasons and caps
        self.admitted = 0
        self.admitted_max_priority: int | None = None
        self.queued = snap.queue.isthmus_pending_jobs
        self.held = 0
        self.backlog_held = 0  # for jobs queued in the backend (policies/backlog.py)
        self.backlog_nodes: dict[str, int] = {}  # GPUs of backlog_held, per node
        self.queue_closed_for: str | None = None  # a gang past queue_closed_after_s held here
        self.exclusion = Exclusion()  # held nodes kept out of queued placements (queue_guard)
        self.claimed: set[str] = set()  # nodes whose releases an earlier hold counts on

    # ---- capacity questions -------------------------------------------------------------
    def static_cap(self, gpus: int, level: int) -> int:
        """Replicas of `gpus` GPUs the largest domain at `level` could hold if it were empty."""
        key = (gpus, level)
        c = self._static.get(key)
        if c is None:
            if level == NODE:
                c = self.max_node_total // gpus
            else:
                per_rack = {r.key: sum(n.total // gpus for n in r.nodes) for r in self.racks}
                if level == RACK:
                    c = max(per_rack.values(), default=0)
                elif level == BLOCK:
                    c = max(
                        (sum(per_rack[r.key] for r in rs) for rs in self.blocks.values()),
                        default=0,
                    )
                else:
                    c = sum(per_rack.values())
            self._static[key] = c
        return c

    def find(
        self,
        g: int,
        replicas: int,
        max_level: int,
        node_cap: NodeCap | None = None,
    ) -> Fit | None:
        """Tightest level first (node, rack, block, pool) up to `max_level`; best fit inside.

        `node_cap` overrides how many replicas a node holds (excluded nodes, CPU or memory
        requests); without it the bucket index answers and failures are memoised.
        """
        if replicas * g > self.free:
            return None
        for level in range(max_level + 1):
            if self.static_cap(g, level) < replicas:
                continue
            if node_cap is None:
                if self.fail_memo.get((g, level), _BIG) <= replicas:
                    continue
                fit = self._find_indexed(g, replicas, level)
                if fit is None:
                    self.fail_memo[(g, level)] = replicas
            else:
                fit = self._find_with_node_cap(g, replicas, level, node_cap)
            if fit is not None:
                return fit
        return None

    def _find_indexed(self, g: int, replicas: int, level: int) -> Fit | None:
        need = replicas * g
        if level == NODE:
            return self._indexed_node(replicas, need)
        if level == RACK:
            best_r: Rack | None = None
            for r in self.racks:
                if (
                    r.free >= need
                    and r.cap(g) >= replicas
                    and (best_r is None or r.free < best_r.free)
                ):
                    best_r = r
            if best_r is None:
                return None
            return self._assign(RACK, best_r.key, [best_r], replicas, lambda n: n.free // g, need)
        if level == BLOCK:
            return self._fast_block(g, replicas, need)
        if sum(r.cap(g) for r in self.racks) < replicas:
            return None
        return self._assign(POOL, "", self.racks, replicas, lambda n: n.free // g, need)

    def _indexed_node(self, replicas: int, need: int) -> Fit | None:
        """The node with the fewest free GPUs that holds `need`, in the emptiest rack."""
        best: tuple[int, int, str] | None = None
        best_rack: Rack | None = None
        for r in self.racks:
            if r.max_free < need:
                continue
            b = r.buckets
            k = need
            while b[k] == 0:
                k += 1
            cand = (k, r.free, r.key)
            if best is None or cand < best:
                best, best_rack = cand, r
        if best is None or best_rack is None:
            return None
        node = next(n for n in best_rack.nodes if n.free == best[0])
        return Fit(NODE, f"{best_rack.key}/{node.name}", [(node, replicas)], node.free - need)

    def _fast_block(self, g: int, replicas: int, need: int) -> Fit | None:
        """The block with the fewest free GPUs that holds the gang."""
        best_b: tuple[int, str] | None = None
        for block, rs in self.blocks.items():
            free = sum(r.free for r in rs)
            if free < need or (best_b is not None and (free, block) >= best_b):
                continue
            if sum(r.cap(g) for r in rs) >= replicas:
                best_b = (free, block)
        if best_b is None:
            return None
        rs = self.blocks[best_b[1]]
        return self._assign(BLOCK, best_b[1], rs, replicas, lambda n: n.free // g, need)

    def _find_with_node_cap(self, g: int, replicas: int, level: int,
                            node_cap: NodeCap) -> Fit | None:
        caps = {n.name: node_cap(n) for n in self.nodes.values()}
        if level == NODE:
            cands = [n for n in self.nodes.values() if caps[n.name] >= replicas]
            if not cands:
                return None
            node = min(cands, key=lambda n: (n.free, n.rack.free, n.name))
            fit_node = [(node, replicas)]
            return Fit(NODE, f"{node.rack.key}/{node.name}", fit_node, node.free - replicas * g)
        groups: list[tuple[str, list[Rack]]]
        if level == RACK:
            groups = [(r.key, [r]) for r in self.racks]
        elif level == BLOCK:
            groups = list(self.blocks.items())
        else:
            groups = [("", self.racks)]
        best: tuple[int, str, list[Rack]] | None = None
        for name, rs in groups:
            if sum(caps[n.name] for r in rs for n in r.nodes) < replicas:
                continue
            free = sum(r.free for r in rs)
            if best is None or (free, name) < best[:2]:
                best = (free, name, rs)
        if best is None:
            return None
        return self._assign(level, best[1], best[2], replicas, lambda n: caps[n.name], replicas * g)

    @staticmethod
    def _assign(
        level: int, domain: str, racks: Iterable[Rack], replicas: int, cap: NodeCap, need: int
    ) -> Fit:
        """Fewest nodes first (largest capacity), the last chunk on the smallest node that
        holds it, so that partially used nodes are filled before whole ones are opened."""
        cands = sorted(
            ((n, c) for r in racks for n in r.nodes if (c := cap(n)) > 0),
            key=lambda nc: (-nc[1], nc[0].free, nc[0].name),
        )
        out: list[tuple[NodeSlot, int]] = []
        remaining = replicas
        used: set[str] = set()
        domain_free = 0
        for r in racks:
            domain_free += r.free
        for n, c in cands:
            if remaining == 0:
                break
            if n.name in used:
                continue
            if c >= remaining:
                last = min(
                    (nc for nc in cands if nc[1] >= remaining and nc[0].name not in used),
                    key=lambda nc: (nc[1], nc[0].free, nc[0].name),
                )
                out.append((last[0], remaining))
                remaining = 0
                break
            out.append((n, c))
            used.add(n.name)
            remaining -= c
        return Fit(level, domain, out, max(0, domain_free - need))

    # ---- mutation ---------------------------------------------------------------------
    def _take(self, node: NodeSlot, gpus: int) -> None:
        old = node.free
        new = old - gpus
        if new < 0:
            raise ValueError(f"over-commit of node {node.name}: {old} free, {gpus} taken")
        node.free = new
        node.rack._changed(old, new)
        self.buckets[old] -= 1
        self.buckets[new] += 1
        self.free -= gpus

    def allocate(self, fit: Fit, gpus: int, cpus: int | None = None,
                 mem: int | None = None) -> None:
        for node, k in fit.nodes:
            self._take(node, k * gpus)
            if cpus and node.free_cpus is not None:
                node.free_cpus -= k * cpus
            if mem and node.free_mem is not None:
                node.free_mem -= k * mem

    def hold_target(self, gpus: int, replicas: int, level: int) -> HoldTarget | None:
        """Where a starving gang's reservation goes: a domain at `level` (or the tightest
        level that could ever hold the gang). With release data in the pool, the domain where
        the gang fits soonest (free GPUs now plus those released by then, per node), then the
        most free GPUs now, then the name; domains too small even when empty are skipped.
        Without release data, the domain with the most free GPUs now (`ready` is inf)."""
        level = next((lv for lv in range(level + 1) if self.static_cap(gpus, lv) >= replicas), -1)
        if level < 0:
            return None
        domains = [d for d in self.domains(level, replicas * gpus) if d[1]]
        return reservation.choose_target(domains, gpus, replicas, self.has_releases, self.claimed)

    def domains(self, level: int, need: int) -> list[tuple[str, list[NodeSlot]]]:
        """Every domain at `level` with its nodes (at NODE, only nodes that could hold
        `need` GPUs when empty), named as `Fit.domain` names them."""
        if level == NODE:
            return [
                (f"{n.rack.key}/{n.name}", [n]) for n in self.nodes.values() if n.total >= need
            ]
        if level == RACK:
            return [(r.key, r.nodes) for r in self.racks]
        if level == BLOCK:
            return [(b, [n for r in rs for n in r.nodes]) for b, rs in self.blocks.items()]
        return [("", list(self.nodes.values()))]

    def take(self, node: NodeSlot, gpus: int) -> None:
        """Take `gpus` free GPUs of `node` (policies/backfill.py); negative: give them back."""
        if gpus:
            self._take(node, gpus)

    def hold(
        self, g: int, replicas: int, level: int, target: HoldTarget | None = None
    ) -> tuple[str, dict[str, int]] | None:
        """Reserve free GPUs for a starving gang in `target` (default: `hold_target`), up to
        the gang's size, largest free nodes first. Returns (domain, GPUs held per node)."""
        if target is None:
            target = self.hold_target(g, replicas, level)
        if target is None:
            return None
        need = replicas * g
        held = 0
        per_node: dict[str, int] = {}
        if self.has_releases:  # a later gang must not wait for the same releases
            self.claimed.update(n.name for n in target.nodes)
        for n in sorted(target.nodes, key=lambda n: (-n.free, n.name)):
            if held >= need or n.free == 0:
                break
            take = per_node[n.name] = min(n.free, need - held)
            self._take(n, take)
            held += take
        self.held += held
        return target.domain, per_node


class CapacityIndex:
    """The working copy of a whole inventory snapshot."""

    def __init__(self, inventory: InventorySnapshot) -> None:
        self.taken_at = inventory.taken_at
        self.unreachable = frozenset(inventory.unreachable)
        self.pools: dict[str, PoolIndex] = {p.name: PoolIndex(p) for p in inventory.pools}
        self.order = sorted(self.pools)
