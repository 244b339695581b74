"""The nodes and racks of the capacity working copy (policies/capacity.py), apart so that the
reservation logic (policies/reservation.py) can read them without importing the index."""

from __future__ import annotations

from datetime import datetime

from broker.domain.topology import BLOCK, NODE, RACK

Releases = tuple[tuple[datetime, int], ...]


class NodeSlot:
    """A node of the working copy. CPU and memory are None when the backend did not report
    them (then only GPUs are checked). `releases` is the snapshot's (time, GPUs) list, kept
    by reference: it is read only when a reservation is placed."""

    __slots__ = ("free", "free_cpus", "free_mem", "name", "rack", "releases", "total")

    def __init__(
        self,
        name: str,
        total: int,
        free: int,
        free_cpus: int | None,
        free_mem: int | None,
        rack: Rack,
        releases: Releases = (),
    ) -> None:
        self.name = name
        self.total = total
        self.free = free
        self.free_cpus = free_cpus
        self.free_mem = free_mem
        self.rack = rack
        self.releases = releases


class Rack:
    __slots__ = ("_cap", "block", "buckets", "free", "key", "max_free", "name", "nodes", "total")

    def __init__(self, block: str, name: str, width: int) -> None:
        self.block = block
        self.name = name
        self.key = f"{block}/{name}"
        self.nodes: list[NodeSlot] = []
        self.free = 0
        self.total = 0
        self.buckets = [0] * (width + 1)
        self.max_free = 0
        self._cap: dict[int, int] = {}

    def cap(self, gpus: int) -> int:
        """Replicas of `gpus` GPUs this rack can hold now."""
        c = self._cap.get(gpus)
        if c is None:
            b = self.buckets
            c = 0
            for k in range(gpus, len(b)):
                if b[k]:
                    c += b[k] * (k // gpus)
            self._cap[gpus] = c
        return c

    def _changed(self, old: int, new: int) -> None:
        b = self.buckets
        b[old] -= 1
        b[new] += 1
        self.free += new - old
        self._cap.clear()
        if new > self.max_free:
            self.max_free = new
        elif old == self.max_free and b[old] == 0:
            k = old
            while k > 0 and b[k] == 0:
                k -= 1
            self.max_free = k


def domain_name(node: NodeSlot, level: int) -> str:
    """The domain at `level` holding `node`, spelt as `Fit.domain` spells it."""
    if level == NODE:
        return f"{node.rack.key}/{node.name}"
    if level == RACK:
        return node.rack.key
    if level == BLOCK:
        return node.rack.block
    return ""
