"""When a domain drains enough for a gang: the nodes' expected releases (`NodeSnapshot.releases`,
from declared time limits) turned into the earliest time `replicas` replicas of `g` GPUs fit,
each on one node. Used by policies.capacity to aim starving gangs' reservations."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.capacity import NodeSlot


@dataclass(slots=True)
class HoldTarget:
    domain: str
    nodes: list[NodeSlot]
    ready: float
    """When the gang would fit there (POSIX seconds): -inf now, inf not as far as known."""


def fit_time(
    nodes: Sequence[NodeSlot], g: int, replicas: int, claimed: Collection[str] = ()
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
