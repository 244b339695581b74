"""Facts: normalised observations of backend objects, produced by the backend adapters.

Classification of raw codes happens in each adapter's classify.py; the core matches only the
normalised `phase`, `pending` and `failure` values. Unknown evidence stays UNKNOWN.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason


class Phase(StrEnum):
    PENDING = "PENDING"  # known to the backend, no rank started
    STARTING = "STARTING"  # some ranks scheduled or starting, not all running
    RUNNING = "RUNNING"  # every rank runs
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"  # neither the queue nor the accounting knows it any more
    UNKNOWN = "UNKNOWN"


ENDED_PHASES: frozenset[Phase] = frozenset(
    {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.PREEMPTED, Phase.LOST}
)
"""Phases after which the backend object runs no more (nothing comes after them)."""


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(description="backend instance name")
    backend_name: str = Field(description="deterministic object name, isthmus-<job>-<attempt>")
    backend_id: str | None = Field(default=None, description="Slurm job id, Job uid, ...")
    job_id: str | None = None
    attempt: int | None = None
    phase: Phase
    reason: Reason = Reason.Unknown
    failure: FailureCategory | None = None
    raw_state: str = ""
    raw_reason: str = ""
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: tuple[str, ...] = ()
    bad_nodes: tuple[str, ...] = Field(
        default=(), description="the nodes blamed for an infrastructure failure, when the "
        "backend can tell (a retry then avoids only these, not the whole allocation)")
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    observed_at: datetime
    actor: str | None = Field(default=None, description="who cancelled, when someone else did")
    image_ids: tuple[str, ...] = Field(
        default=(), description="the image digests the ranks run (Kubernetes: each pod's "
        "containerStatuses[].imageID), once they have started")
    gpu_models: tuple[str, ...] = Field(
        default=(), description="the GPU models of the nodes in `nodes`, as the backend names them")
