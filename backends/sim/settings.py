"""Backend settings (isthmus.yaml ``backends[].settings`` for kind ``sim``).

A simulated backend's pools are the configured pools that name it; each one's shape is its
``capacity`` (nodes, GPUs per node, nodes per rack, racks per block: the same numbers the
broker uses to reject jobs that could never fit, so the two cannot drift apart), plus CPUs
and memory per node from ``settings.pools.<pool>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from backends.base import parse_settings
from backends.slurm.containers import ContainerSettings
from broker.domain.spec import MemorySize

Rate = Annotated[float, Field(ge=0.0, le=1.0)]


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Per-attempt probability of each simulated fault."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    node_loss: Rate = 0.0
    oom: Rate = 0.0
    image_pull: Rate = 0.0


@dataclass(frozen=True, slots=True)
class PoolExtras:
    __pydantic_config__ = ConfigDict(extra="forbid")

    cpus_per_node: Annotated[int, Field(ge=0, le=65536)] = 0
    memory_per_node: MemorySize = 0


@dataclass(frozen=True, slots=True)
class SimSettings:
    __pydantic_config__ = ConfigDict(extra="forbid")  # parse_settings: unknown keys refused

    emulate: Literal["slurm", "k8s"] = "slurm"
    """The kind of backend this one pretends to be: what jobs ask for and snapshots show."""
    speed: Annotated[float, Field(gt=0.0, le=100_000.0)] = 1.0
    """Simulated seconds per wall second."""
    seed: int = 0
    start_delay: Annotated[float, Field(ge=0.0, le=86_400.0)] = 2.0
    """Simulated seconds from allocation until every rank runs (image pull, rendezvous)."""
    runtime_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    """A job without `isthmus.io/sim-duration` runs this fraction of its max_runtime."""
    progress_url: str | None = None
    """Where progress reports go; unset: the broker's own listener (server.host/port)."""
    progress: bool = True
    """False: no progress reports at all."""
    progress_interval: Annotated[float, Field(gt=0.0)] = 5.0
    """Simulated seconds between progress reports of a running job."""
    foreign_load: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Fraction of each pool's nodes busy with work that is not Isthmus's."""
    foreign_arrivals_per_hour: Annotated[float, Field(ge=0.0)] = 0.0
    """Foreign jobs arriving (Poisson, simulated time) on top of `foreign_load`."""
    faults: FaultRates = field(default_factory=FaultRates)
    outage_file: str | None = None
    """Fault drill: while a file exists at this path, every call fails as BackendUnavailable
    (an outage the broker must ride out; bench/soak.py). Unset: never."""
    pools: Mapping[str, PoolExtras] = field(default_factory=dict)
    container: ContainerSettings | None = None
    """How the simulated pools run images, as a Slurm backend says it (``container.runtime``);
    unset: they run images (a Kubernetes-like backend always does)."""

    @property
    def runs_images(self) -> bool:
        return self.container is None or self.container.runs_images

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SimSettings:
        """Raises SettingsError (a ValueError) naming every bad key."""
        return parse_settings(cls, data, "sim")
