"""Work that is not Isthmus's on a simulated backend: whole nodes held from the start
(`ExternalLoad.occupied`) and jobs arriving as a Poisson process. Both take GPUs, queue and
release like any job, but the broker never sees them as its own."""

from __future__ import annotations

import random
from typing import Protocol

from backends.sim.model import ExternalLoad, Job, Node, SimPoolSpec


class ForeignHost(Protocol):
    """What foreign work needs of a simulated backend (backend.SimBackend), declared here so
    that this module does not import the backend that uses it."""

    external: ExternalLoad
    rng: random.Random
    pools: dict[str, SimPoolSpec]
    pool_nodes: dict[str, list[Node]]

    def foreign_job(self, pool: str, replicas: int, gpus: int, duration: float,
                    limit: float | None, wanted: tuple[str, ...] = ()) -> Job: ...

    def enqueue(self, job: Job, schedule: bool = True) -> None: ...

    def schedule(self, pool: str) -> None: ...


def next_arrival(b: ForeignHost, t: float) -> float:
    """When the next foreign job arrives (Poisson, simulated time); never without a rate."""
    rate = b.external.arrivals_per_hour
    return t + b.rng.expovariate(rate / 3600.0) if rate > 0 else float("inf")


def arrive(b: ForeignHost) -> None:
    """A foreign job of a drawn size enters the queue of a drawn pool."""
    pool = b.rng.choice(sorted(b.pools))
    width = b.pools[pool].gpus_per_node
    gpus = b.rng.choice(b.external.gpus)
    replicas, per = (gpus // width, width) if gpus > width else (1, gpus)
    duration = b.rng.expovariate(1.0 / b.external.mean_duration_s)
    b.enqueue(b.foreign_job(pool, replicas, per, duration, b.external.limit_s))


def occupy(b: ForeignHost, fraction: float) -> None:
    """Foreign work holding whole nodes for good: `fraction` of each pool's nodes, spread
    over racks by a seeded draw."""
    if fraction <= 0:
        return
    for pool, nodes in b.pool_nodes.items():
        for node in b.rng.sample(nodes, round(len(nodes) * min(fraction, 1.0))):
            b.enqueue(b.foreign_job(pool, 1, node.total, float("inf"), None, (node.name,)),
                      schedule=False)
        b.schedule(pool)
