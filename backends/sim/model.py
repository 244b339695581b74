"""What a simulated backend is made of: pools' shapes, failure and load parameters, and its
jobs and nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.sim.faults import Fault
from backends.sim.progress import Reporting
from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory
from broker.domain.inventory import NodeSnapshot, TopologyPath
from broker.domain.reasons import Reason


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
    node_count: int | None = None
    """Nodes when the last block or rack is not full (else blocks x racks x nodes per rack)."""
    cpus_per_node: int = 0
    """0: not reported (CPUs are not modelled)."""
    memory_per_node: int = 0
    """Bytes; 0: not reported."""
    excludes_nodes: bool = True
    """The pool honours a placement's exclude_nodes (never starts the job there)."""
    runs_images: bool = True
    """The pool runs a job's entrypoint.image (settings.container.runtime other than none)."""

    @property
    def nodes(self) -> int:
        if self.node_count is not None:
            return self.node_count
        return self.blocks * self.racks_per_block * self.nodes_per_rack


@dataclass(frozen=True, slots=True)
class SimFailures:
    job_failure_rate: float = 0.0
    """Probability that an attempt fails part-way, in one of `categories`."""
    categories: tuple[tuple[FailureCategory, float], ...] = (
        (FailureCategory.INFRA_TRANSIENT, 0.6),
        (FailureCategory.USER_ERROR, 0.3),
        (FailureCategory.RESOURCE_ENV, 0.1),
    )
    start_delay_s: float = 30.0
    """Time from allocation until every rank runs (image pull, rendezvous)."""
    fault_rates: tuple[tuple[Fault, float], ...] = ()
    """Per-attempt probability of each named fault (node loss, OOM, image pull)."""


@dataclass(frozen=True, slots=True)
class ExternalLoad:
    """Work submitted to the backend directly (not through Isthmus)."""

    arrivals_per_hour: float = 0.0
    gpus: tuple[int, ...] = (1, 2, 4, 8, 16)
    mean_duration_s: float = 3600.0
    limit_s: float | None = None
    """Declared time limit of each external job (None: the backend knows no end)."""
    occupied: float = 0.0
    """Fraction of each pool's nodes held from the start by foreign work that never ends."""


@dataclass(slots=True)
class Job:
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
    exclude: frozenset[str] = frozenset()
    """Nodes it must not start on (the placement's exclude_nodes, where the pool honours it)."""
    nodes: tuple[str, ...] = ()
    started: float | None = None
    ended: float | None = None
    phase: Phase = Phase.PENDING
    failure: FailureCategory | None = None
    fault: Fault | None = None
    """A named fault this attempt will hit (an annotation or a drawn fault rate)."""
    seq: int = 0
    reason: Reason = Reason.BackendPending
    message: str = ""
    bad_nodes: tuple[str, ...] = ()
    done_before: float = 0.0
    """Simulated seconds of work restored from a checkpoint when the attempt started."""
    report: Reporting | None = None
    """Its progress reporting state, when it reports or checkpoints."""


@dataclass(slots=True)
class Node:
    name: str
    pool: str
    total: int
    free: int
    topo: TopologyPath
    up: bool = True
    snap: NodeSnapshot | None = field(default=None, repr=False)
    running: dict[str, int] = field(default_factory=dict)
    """GPUs each running job holds here, by job name."""


def fit_nodes(nodes: dict[str, Node], pool_nodes: dict[str, list[Node]], job: Job
              ) -> list[Node] | None:
    """The node of each replica of `job` if it fits now: on the nodes it asks for, else in
    the first domain (by name) at its level with room, else None; never on its excluded
    nodes."""
    if job.wanted and len(job.wanted) == job.replicas:
        need: dict[str, int] = {}
        for wanted in job.wanted:
            need[wanted] = need.get(wanted, 0) + job.gpus
        if all(
            (nd := nodes.get(w)) is not None and nd.up and nd.free >= k
            and w not in job.exclude for w, k in need.items()
        ):
            return [nodes[w] for w in job.wanted]
    groups: dict[str, list[Node]] = {}
    for n in pool_nodes[job.pool]:
        if n.up and n.free >= job.gpus and n.name not in job.exclude:
            key = n.topo.domain(job.level, n.name) if job.level else ""
            groups.setdefault(key, []).append(n)
    for key in sorted(groups):
        out: list[Node] = []
        for n in groups[key]:
            out.extend([n] * min(n.free // job.gpus, job.replicas - len(out)))
            if len(out) == job.replicas:
                return out
    return None
