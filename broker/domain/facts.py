"""Facts: normalised observations of backend objects, produced by the backend adapters.

Classification of raw codes happens in each adapter's classify.py, which returns a `Finding`;
`Finding.fact` is the one constructor from a backend's result to a `Fact`. The core matches
only the normalised `phase`, `pending` and `failure` values. Unknown evidence stays UNKNOWN.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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


@dataclass(frozen=True, slots=True)
class Finding:
    """What a backend's classifier made of the evidence about one object: every field of a
    Fact but which object it is and when it was seen (same names, same defaults: a test holds
    them together). `fact` adds those and is the one way from a backend's result to a Fact."""

    phase: Phase
    reason: Reason = Reason.Unknown
    failure: FailureCategory | None = None
    raw_state: str = ""
    raw_reason: str = ""
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: tuple[str, ...] = ()
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    bad_nodes: tuple[str, ...] = ()
    actor: str | None = None
    teardown: bool = False
    """Not part of the Fact: the adapter must stop the object (a gang that cannot go on) and
    keep this finding as its last word."""

    def fact(self, *, backend: str, backend_name: str, observed_at: datetime,
             backend_id: str | None = None, job_id: str | None = None,
             attempt: int | None = None, image_ids: tuple[str, ...] = (),
             gpu_models: tuple[str, ...] = ()) -> Fact:
        judged = {f.name: getattr(self, f.name) for f in fields(self) if f.name in FACT_FIELDS}
        return Fact(backend=backend, backend_name=backend_name, backend_id=backend_id,
                    job_id=job_id, attempt=attempt, observed_at=observed_at,
                    image_ids=image_ids, gpu_models=gpu_models, **judged)


FACT_FIELDS = frozenset(Fact.model_fields)
