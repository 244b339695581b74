"""Inventory snapshots: what the backends have, as the placement policies see it.

Backends build these (Slurm from sinfo/scontrol topology, Kubernetes from Nodes and Pods);
policies read them and never do I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.spec import BackendKind, Ceiling
from broker.domain.topology import TopologyLevel


def pool_is_candidate(flavor: str, kind: str, wanted_flavors: Collection[str],
                      wanted_backend: str) -> bool:
    """Whether a pool of `flavor` on a backend of `kind` may serve a job that accepts
    `wanted_flavors` on backend kind `wanted_backend` (`any`, `slurm`, `k8s`). The one rule
    behind the feasibility check at submission and the placement of each cycle."""
    return flavor in wanted_flavors and wanted_backend in ("any", kind)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TopologyPath(_Frozen):
    """Where a node sits: block (spine) > rack (leaf switch) > node."""

    block: str = ""
    rack: str = ""

    def domain(self, level: str, node: str) -> str:
        if level == "node":
            return f"{self.block}/{self.rack}/{node}"
        if level == "rack":
            return f"{self.block}/{self.rack}"
        if level == "block":
            return self.block
        return ""


class NodeSnapshot(_Frozen):
    name: str
    total_gpus: int = Field(ge=0)
    free_gpus: int = Field(ge=0)
    cpus: int = Field(default=0, ge=0)
    free_cpus: int = Field(default=0, ge=0)
    memory_bytes: int = Field(default=0, ge=0)
    free_memory_bytes: int = Field(default=0, ge=0)
    topology: TopologyPath = Field(default_factory=TopologyPath)
    schedulable: bool = True
    reason: str | None = Field(default=None, description="why not schedulable (drain, down)")
    releases: tuple[tuple[datetime, int], ...] = Field(
        default=(),
        description="(time, GPUs): when busy GPUs are expected back, from the declared time "
        "limits of the work on the node, not its true run time; busy GPUs not listed have no "
        "known end and count as never released",
    )


class QueuedShape(_Frozen):
    """The gang of one Isthmus job waiting in a backend queue: what GPUs it can start on."""

    replicas: int = Field(ge=1, le=Ceiling.REPLICAS)
    gpus_per_replica: int = Field(ge=1, le=Ceiling.GPUS_PER_REPLICA)
    level: TopologyLevel | None = Field(
        default=None, description="the topology level all replicas must share (None: any)"
    )

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


class QueueDepth(_Frozen):
    """GPU demand already pending in the backend for this pool."""

    isthmus_pending_gpus: int = Field(default=0, ge=0)
    foreign_pending_gpus: int = Field(default=0, ge=0)
    isthmus_pending_jobs: int = Field(default=0, ge=0)
    expected_wait_seconds: float | None = Field(default=None, ge=0)
    isthmus_pending_shapes: tuple[QueuedShape, ...] | None = Field(
        default=None,
        max_length=4096,
        description="the gangs of the Isthmus jobs pending here, in queue order, when the "
        "backend reports them (None: not reported; admission then holds free GPUs for all of "
        "isthmus_pending_gpus whatever their shape)",
    )

    @property
    def pending_gpus(self) -> int:
        return self.isthmus_pending_gpus + self.foreign_pending_gpus


class PoolSnapshot(_Frozen):
    name: str
    backend_kind: BackendKind
    backend: str = Field(description="backend instance name from isthmus.yaml")
    flavor: str
    selector: str = Field(default="", description="partition name or node selector, as text")
    cost_weight: float = 1.0
    shared: bool = True
    drained: bool = False
    max_isthmus_pending: int | None = Field(
        default=None, description="cap on Isthmus jobs pending in this backend pool"
    )
    runs_images: bool = Field(
        default=True,
        description="the backend runs a job's entrypoint.image (false: a Slurm backend with "
        "container.runtime none); a job that names an image is never placed here",
    )
    excludes_nodes: bool = Field(
        default=False,
        description="the backend honours a placement's exclude_nodes for work it queues "
        "(Slurm --exclude, a Kubernetes node affinity): jobs queued there while a starving gang "
        "holds capacity are kept off the held nodes instead of the queue being closed",
    )
    nodes: tuple[NodeSnapshot, ...] = ()
    queue: QueueDepth = Field(default_factory=QueueDepth)
    unavailable: str | None = Field(
        default=None,
        description="why the pool's backend cannot be used now (which backend, the last error, "
        "since when); placement then gives BackendUnavailable. Such a pool has its configured "
        "shape only, no free GPUs",
    )
    stale: str | None = Field(
        default=None,
        description="set when the pool comes from its backend's last good inventory because "
        "the backend did not answer in time: from when",
    )

    @property
    def total_gpus(self) -> int:
        return sum(n.total_gpus for n in self.nodes)

    @property
    def free_gpus(self) -> int:
        return sum(n.free_gpus for n in self.nodes if n.schedulable)


class InventorySnapshot(_Frozen):
    taken_at: datetime
    pools: tuple[PoolSnapshot, ...] = ()
    unreachable: tuple[str, ...] = Field(
        default=(), description="backend instances that could not be read this time"
    )

    def pool(self, name: str) -> PoolSnapshot | None:
        return next((p for p in self.pools if p.name == name), None)
