"""Where a starving gang's reservation goes. The nodes' expected releases
(`NodeSnapshot.releases`, from declared time limits) turned into the earliest time `replicas`
replicas of `g` GPUs fit, each on one node, and the choice of the domain that drains soonest.
Used by policies.capacity, whose index it does not import (it reads nodes only)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from policies.slots import NodeSlot


@dataclass(slots=True)
class HoldTarget:
    domain: str
    nodes: list[NodeSlot]
    ready: float
    """When the gang would fit there (POSIX seconds): -inf now, inf not as far as known."""


class NodeView(Protocol):
    """What `fit_time` reads of a node (a NodeSlot, or backfill's view of a held one)."""

    @property
    def name(self) -> str: ...
    @property
    def free(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def releases(self) -> Sequence[tuple[datetime, int]]: ...


def fit_time(
    nodes: Sequence[NodeView], g: int, replicas: int, claimed: Collection[str] = ()
) -> float:
    """The earliest time (POSIX seconds) at which `replicas` replicas of `g` GPUs fit on
    `nodes`: each node's free GPUs now plus the GPUs it releases by then, each replica on one
    node; releases of `claimed` nodes do not count. -inf if they fit now, inf if they never do
    as far as the backends know. A node never counts more than its total, so malformed release
    data cannot invent GPUs."""
    cap = 0
    events: list[tuple[float, int, int]] = []
    for i, n in enumerate(nodes):
        cap += n.free // g
        if n.name in claimed:
            continue
        for at, gpus in n.releases:
            if gpus > 0:
                events.append((at.timestamp(), i, gpus))
    if cap >= replicas:
        return -math.inf
    events.sort()
    avail = [n.free for n in nodes]
    for t, i, gpus in events:
        old = avail[i]
        new = avail[i] = min(nodes[i].total, old + gpus)
        cap += new // g - old // g
        if cap >= replicas:
            return t
    return math.inf


def choose_target(
    domains: Sequence[tuple[str, list[NodeSlot]]], g: int, replicas: int,
    has_releases: bool, claimed: Collection[str],
) -> HoldTarget | None:
    """Among non-empty `domains` (name, nodes): with release data in the pool, the domain
    where the gang fits soonest (free GPUs now plus those released by then, per node), then
    the most free GPUs now, then the name; domains too small even when empty are skipped.
    Without release data, the domain with the most free GPUs now (`ready` is inf)."""
    if not domains:
        return None
    if not has_releases:
        domain, nodes = max(domains, key=lambda d: (sum(n.free for n in d[1]), d[0]))
        return HoldTarget(domain, nodes, math.inf)
    best: tuple[float, int, str] | None = None
    target: HoldTarget | None = None
    for domain, nodes in domains:
        if sum(n.total // g for n in nodes) < replicas:
            continue
        ready = fit_time(nodes, g, replicas, claimed)
        # max over (-ready, free, name): ties fall as they did before release data
        key = (-ready, sum(n.free for n in nodes), domain)
        if best is None or key > best:
            best, target = key, HoldTarget(domain, nodes, ready)
    return target
