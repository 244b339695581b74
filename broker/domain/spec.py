"""JobSpec: what a user asks for, versioned and strictly validated.

Unknown fields are refused (a typo must not silently change a 64-GPU job), and every message
names the field and says what to write instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)

from broker.domain import metadata_keys
from broker.domain.scheduling import Scheduling
from broker.domain.units import format_duration, parse_duration, parse_size

API_VERSION = "isthmus/v1"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Duration = Annotated[
    int,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    Field(description="a duration such as '2h', '90m' or '1h30m' (seconds when a number)"),
]
Size = Annotated[
    int,
    BeforeValidator(parse_size),
    Field(description="a size such as '64Gi' or '512Mi' (bytes when a number)"),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class TopologyLevel(StrEnum):
    NODE = "node"
    RACK = "rack"
    BLOCK = "block"

    @property
    def rank(self) -> int:
        """Tighter levels have lower rank: node < rack < block."""
        return {"node": 0, "rack": 1, "block": 2}[self.value]


class BackendKind(StrEnum):
    SLURM = "slurm"
    K8S = "k8s"


class Gang(_Strict):
    replicas: int = Field(ge=1, description="ranks that must all start together")
    gpus_per_replica: int = Field(ge=1, le=64, description="GPUs each rank needs")
    cpus_per_replica: int | None = Field(default=None, ge=1)
    memory_per_replica: Size | None = None

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


class FlavorConstraints(_Strict):
    gpu_model: str | None = None
    min_gpu_memory_gb: int | None = Field(default=None, ge=1)
    interconnect: str | None = None


class Topology(_Strict):
    required: TopologyLevel | None = None
    preferred: TopologyLevel | None = None

    @model_validator(mode="after")
    def _preferred_not_looser(self) -> Topology:
        if self.required and self.preferred and self.preferred.rank > self.required.rank:
            raise ValueError(
                f"preferred level '{self.preferred}' is looser than required "
                f"'{self.required}'; prefer a tighter level or drop 'preferred'"
            )
        return self


class Entrypoint(_Strict):
    image: str | None = Field(default=None, min_length=1, max_length=512)
    command: list[str] | None = Field(default=None, min_length=1)
    script: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    launcher: Literal["ranks", "batch"] = Field(
        default="ranks",
        description="'ranks': the command or script runs once per rank; 'batch': the script "
        "runs as sbatch runs it (once, on the first node on Slurm; its own srun starts the ranks)",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Entrypoint:
        if self.command is None and self.script is None:
            raise ValueError("give either 'command' (with 'image') or a batch 'script'")
        if self.command is not None and self.script is not None:
            raise ValueError("give 'command' or 'script', not both")
        if self.launcher == "batch" and self.script is None:
            raise ValueError("launcher 'batch' runs a batch 'script'; give 'script'")
        return self


class Mount(_Strict):
    name: str = Field(min_length=1, description="a data set or volume known to the platform")
    path: str = Field(pattern=r"^/", description="absolute mount path inside the job")
    read_only: bool = True


class Checkpoint(_Strict):
    dir: str | None = None
    interval: Duration | None = None
    resumable: bool = False
    grace: Duration = Field(default=120, description="time to checkpoint after a stop signal")


class RetryPolicy(_Strict):
    max_attempts: int = Field(default=3, ge=1, le=20)
    max_wasted_gpu_hours: float | None = Field(default=None, gt=0)
    backoff: Duration = 30
    max_backoff: Duration = 900


class JobSpec(_Strict):
    """A gang-scheduled training job, as submitted."""

    api_version: Literal["isthmus/v1"] = "isthmus/v1"
    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits and '-'")
    team: str = Field(min_length=1, max_length=63)
    queue: str = Field(default="default", min_length=1, max_length=63)
    priority: str = Field(default="normal", min_length=1, max_length=63)
    gang: Gang
    flavors: list[str] = Field(default_factory=list, description="acceptable, preferred first")
    constraints: FlavorConstraints | None = None
    topology: Topology = Field(default_factory=Topology)
    backend: Literal["slurm", "k8s", "any"] = "any"
    entrypoint: Entrypoint
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    max_runtime: Duration = 86400
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="added to the Job, its pods and its Service on Kubernetes (kept by Isthmus "
        "on Slurm); Kubernetes label syntax",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="added to every pod on Kubernetes (ignored on Slurm)"
    )
    code_version: str | None = None
    data_version: str | None = None
    scheduling: Scheduling | None = Field(
        default=None, description="start time, dependencies, array membership (sbatch style)"
    )

    @field_validator("flavors")
    @classmethod
    def _unique_flavors(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each flavor may be listed once")
        return v

    @field_validator("env")
    @classmethod
    def _env_keys(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_KEY.match(k)]
        if bad:
            raise ValueError(
                f"invalid variable name(s) {bad}: use letters, digits and '_', not starting "
                "with a digit"
            )
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return metadata_keys.check("label", v, labels=True)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        return metadata_keys.check("annotation", v, labels=False)

    @model_validator(mode="after")
    def _flavor_or_constraints(self) -> JobSpec:
        if not self.flavors and self.constraints is None:
            raise ValueError("give 'flavors' (e.g. [\"h100-80g\"]) or 'constraints'")
        no_image = self.entrypoint.command is not None and self.entrypoint.image is None
        if no_image and self.backend == "k8s":
            raise ValueError("entrypoint.image is required when backend is 'k8s'")
        return self

    def canonical_json(self) -> str:
        """A stable serialisation: the basis of the spec hash and of idempotency checks."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def spec_hash(self) -> str:
        """Hash of what the user asked for: defaults are left out, so a field added to the
        spec later (with a default) does not change the hash of specs that never used it."""
        data = self.model_dump(mode="json", exclude_defaults=True)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def spec_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
