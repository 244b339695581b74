"""Attempts and run snapshots: each try of a job is bound to an immutable snapshot of its spec."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.failures import FailureCategory
from broker.domain.spec import BackendKind, JobSpec
from broker.domain.topology import TopologyLevel

MAX_EXCLUDED_NODES = 4096
"""Most nodes one placement excludes (a held domain is a rack or block of a pool)."""


def backend_object_name(job_id: str, attempt: int) -> str:
    """Deterministic backend name, so a lookup after a crash finds what was created."""
    return f"isthmus-{job_id}-{attempt}"


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: BackendKind
    backend_instance: str
    pool: str
    flavor: str
    topology_level: TopologyLevel | None = None
    topology_domain: str | None = Field(default=None, description="e.g. 'spine/rack2'")
    nodes: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = Field(
        default=(), max_length=MAX_EXCLUDED_NODES,
        description="nodes the backend must not start this attempt on: a job queued in the "
        "backend while a starving gang holds capacity there (policies/placement.py)",
    )


class RunSnapshot(BaseModel):
    """Everything an attempt runs with; never changes once written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: JobSpec
    spec_hash: str
    image_digest: str | None = None
    code_version: str | None = None
    data_version: str | None = None
    placement: Placement | None = None
    backend_name: str | None = None
    resume_from: str | None = Field(default=None, description="checkpoint to resume from")
    admitted_as: str | None = Field(
        default=None, description="the priority class the attempt was admitted as, when not "
        "its spec's (a spent GPU-hour budget with `enforce: lowest`); written only when set")

    @classmethod
    def of(cls, spec: JobSpec) -> RunSnapshot:
        return cls(
            spec=spec,
            spec_hash=spec.spec_hash(),
            code_version=spec.code_version,
            data_version=spec.data_version,
        )


class Attempt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str
    number: int = Field(ge=1)
    snapshot: RunSnapshot
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    failure: FailureCategory | None = None
    preempted: bool = False

    @property
    def backend_name(self) -> str:
        return backend_object_name(self.job_id, self.number)
