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
    WithJsonSchema,
    field_validator,
    model_validator,
)

from broker.domain import metadata_keys
from broker.domain.batch_options import BatchOptions
from broker.domain.native import NativeOptions
from broker.domain.notices import JobNotify
from broker.domain.scheduling import Scheduling
from broker.domain.stop_signal import STOP_SIGNAL
from broker.domain.text import MultilineText, Text, TextKey
from broker.domain.topology import TopologyLevel
from broker.domain.units import (
    duration_parser,
    format_duration,
    format_size,
    size_parser,
)

API_VERSION = "isthmus/v1"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

DAY = 86400


class Ceiling:
    """The hard upper bound of every numeric, duration and size field: nothing above is ever
    constructed, so deadlines, rendered scripts and database columns cannot overflow. The
    installation's own (lower) limits are `limits:` in isthmus.yaml, checked at submit."""

    REPLICAS = 65536
    GPUS_PER_REPLICA = 64
    TASKS_PER_REPLICA = 256
    CPUS_PER_REPLICA = 65536
    MEMORY_PER_REPLICA = 2**50  # 1Pi
    GPU_MEMORY_GB = 65536
    MAX_RUNTIME = 366 * DAY  # also bounds checkpoint.interval
    GRACE = DAY
    BACKOFF = 30 * DAY
    MAX_ATTEMPTS = 20
    WASTED_GPU_HOURS = 1e9
    # collections and strings; the request body limit (server.max_body_bytes) bounds the sum
    NAME_LENGTH = 63
    TEXT_LENGTH = 1024  # image, queue, versions, mount names and paths
    FLAVORS = 16
    COMMAND_ARGS = 1024
    ARG_LENGTH = 32768
    SCRIPT_LENGTH = 1_000_000
    ENV_VARS = 256
    ENV_VALUE_LENGTH = 32768
    METADATA_ENTRIES = 64  # labels, annotations each
    METADATA_KEY_LENGTH = 317  # a 253-character prefix, '/', a 63-character name
    ANNOTATION_VALUE_LENGTH = 65536
    MOUNTS = 32


_DURATION_TEXT = r"^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
_SIZE_TEXT = r"^[0-9]+(\.[0-9]+)?\s*(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?B?$"
_FORMAT_DURATION = PlainSerializer(format_duration, return_type=str)


def _duration_schema(maximum: int) -> WithJsonSchema:
    return WithJsonSchema({
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": maximum},
            {"type": "string", "pattern": _DURATION_TEXT, "minLength": 2, "maxLength": 32},
        ],
        "description": "a duration such as '2h', '90m' or '1h30m' (seconds when a number), "
        f"at most {format_duration(maximum)}",
    })


RuntimeDuration = Annotated[
    int, BeforeValidator(duration_parser(Ceiling.MAX_RUNTIME)), _FORMAT_DURATION,
    _duration_schema(Ceiling.MAX_RUNTIME),
]
GraceDuration = Annotated[
    int, BeforeValidator(duration_parser(Ceiling.GRACE)), _FORMAT_DURATION,
    _duration_schema(Ceiling.GRACE),
]
BackoffDuration = Annotated[
    int, BeforeValidator(duration_parser(Ceiling.BACKOFF)), _FORMAT_DURATION,
    _duration_schema(Ceiling.BACKOFF),
]
MemorySize = Annotated[
    int,
    BeforeValidator(size_parser(Ceiling.MEMORY_PER_REPLICA)),
    WithJsonSchema({
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": Ceiling.MEMORY_PER_REPLICA},
            {"type": "string", "pattern": _SIZE_TEXT, "maxLength": 32},
        ],
        "description": "a size such as '64Gi' or '512Mi' (bytes when a number), at most "
        f"{format_size(Ceiling.MEMORY_PER_REPLICA)}",
    }),
]


def _no_bool_or_text(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, str):
        raise ValueError(f"expected an integer, got the string {value[:20]!r}; write it unquoted")
    return value


WholeNumber = Annotated[int, BeforeValidator(_no_bool_or_text)]
"""An integer as JSON Schema means it (8 or 8.0), never a boolean or a string: `true` taken as
1 replica or "2" as 2 hides a client bug."""
ShortText = Annotated[Text, Field(min_length=1, max_length=Ceiling.TEXT_LENGTH)]
FreeText = Annotated[Text, Field(max_length=Ceiling.TEXT_LENGTH)]
Name = Annotated[Text, Field(min_length=1, max_length=Ceiling.NAME_LENGTH)]
MetadataKey = Annotated[TextKey, Field(max_length=Ceiling.METADATA_KEY_LENGTH)]
# What metadata_keys checks, stated for the OpenAPI document (less the reserved prefix).
_K8S_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_K8S_KEY = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_K8S_NAME}$"


def _keys(pattern: str, max_length: int) -> dict[str, Any]:
    return {"propertyNames": {"pattern": pattern, "maxLength": max_length}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class BackendKind(StrEnum):
    """The kind of a configured backend. A job asks for `slurm`, `k8s` or `any`
    (`JobSpec.backend`), never `sim`: a simulated backend reports the kind it emulates."""

    SLURM = "slurm"
    K8S = "k8s"
    SIM = "sim"


class Gang(_Strict):
    replicas: WholeNumber = Field(
        ge=1, le=Ceiling.REPLICAS, description="ranks that must all start together"
    )
    gpus_per_replica: WholeNumber = Field(
        ge=1, le=Ceiling.GPUS_PER_REPLICA, description="GPUs each rank needs"
    )
    cpus_per_replica: WholeNumber | None = Field(default=None, ge=1, le=Ceiling.CPUS_PER_REPLICA)
    memory_per_replica: MemorySize | None = None
    one_per_node: bool = Field(
        default=False, description="each replica on a node of its own (sbatch -N asks for "
        "nodes): never two on one node; otherwise replicas may share a node that has room")
    tasks_per_replica: WholeNumber = Field(
        default=1, ge=1, le=Ceiling.TASKS_PER_REPLICA,
        description="processes (Slurm tasks, ranks) each replica runs, sharing its GPUs "
        "(sbatch --ntasks-per-node with -N); its GPUs are split among them when they divide")

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def tasks(self) -> int:
        """Every rank of the gang: replicas x tasks per replica."""
        return self.replicas * self.tasks_per_replica


class FlavorConstraints(_Strict):
    gpu_model: FreeText | None = None
    min_gpu_memory_gb: WholeNumber | None = Field(default=None, ge=1, le=Ceiling.GPU_MEMORY_GB)
    interconnect: FreeText | None = None


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
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["command"], "properties": {"command": {"type": "array"},
                                                         "script": {"type": "null"}}},
                {"required": ["script"], "properties": {"script": {"type": "string"},
                                                        "command": {"type": "null"}}},
            ]
        }
    )

    image: Text | None = Field(default=None, min_length=1, max_length=512)
    command: list[Annotated[MultilineText, Field(max_length=Ceiling.ARG_LENGTH)]] | None = Field(
        default=None, min_length=1, max_length=Ceiling.COMMAND_ARGS
    )
    script: MultilineText | None = Field(
        default=None, min_length=1, max_length=Ceiling.SCRIPT_LENGTH
    )
    launcher: Literal["ranks", "batch"] = Field(
        default="ranks",
        description="'ranks': the command or script runs once per rank; 'batch': the script "
        "runs as sbatch runs it (once, on the first node on Slurm; its own srun starts the ranks)",
    )

    batch: BatchOptions | None = Field(
        default=None, description="sbatch's output, error and exclusive (launcher 'batch')")

    @property
    def ranks_image(self) -> str | None:
        """The image every rank must run in, on any backend. None for launcher 'batch': there
        the image is what the script runs in on Kubernetes, while Slurm runs the script as
        sbatch runs it (its own srun starts the ranks, on the site's software), so a pool that
        runs no images may still take it."""
        return self.image if self.launcher != "batch" else None

    @model_validator(mode="after")
    def _one_kind(self) -> Entrypoint:
        if self.command is None and self.script is None:
            raise ValueError("give either 'command' (with 'image') or a batch 'script'")
        if self.command is not None and self.script is not None:
            raise ValueError("give 'command' or 'script', not both")
        if self.launcher == "batch" and self.script is None:
            raise ValueError("launcher 'batch' runs a batch 'script'; give 'script'")
        if self.batch is not None and self.launcher != "batch":
            raise ValueError("'batch' options belong to launcher 'batch'")
        return self


_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Mount(_Strict):
    """A volume by reference (a PersistentVolumeClaim on Kubernetes). Which names a team may
    mount is the installation's `tenancy.mounts` allow-list, checked at submit."""

    name: ShortText = Field(
        max_length=253, pattern=_DNS_SUBDOMAIN,
        description="a data set or volume known to the platform (a lower-case DNS name, like "
        "a PersistentVolumeClaim's)",
    )
    path: Text = Field(
        pattern=r"^/", max_length=Ceiling.TEXT_LENGTH,
        description="absolute mount path inside the job, without '.' or '..' parts",
    )
    read_only: bool = True

    @field_validator("path")
    @classmethod
    def _clean_path(cls, v: str) -> str:
        parts = v.split("/")[1:]
        if v == "/" or any(p in ("", ".", "..") for p in parts) or ":" in v:
            raise ValueError(
                f"{v!r} is not a clean absolute path: no '.', '..', '//', ':' or trailing "
                "'/', and not '/' itself (write e.g. /data/imagenet)"
            )
        return v


class Checkpoint(_Strict):
    dir: FreeText | None = None
    interval: RuntimeDuration | None = None
    resumable: bool = False
    grace: GraceDuration = Field(
        default=120, description="time to checkpoint after a stop signal"
    )
    signal: str = Field(
        default="USR1", pattern=STOP_SIGNAL,
        description="the signal sent `grace` seconds before the end (sbatch --signal), "
                    "without SIG: a name (USR1, USR2, TERM, ...) or a number 1 to 64",
    )
    signal_batch_only: bool = Field(
        default=True,
        description="to the batch script only (sbatch --signal=B:...); false: to the job's "
                    "steps as Slurm does without B: (README, HPC section, per backend)",
    )


class RetryPolicy(_Strict):
    max_attempts: WholeNumber = Field(default=3, ge=1, le=Ceiling.MAX_ATTEMPTS)
    max_wasted_gpu_hours: float | None = Field(
        default=None, gt=0, le=Ceiling.WASTED_GPU_HOURS, allow_inf_nan=False
    )
    backoff: BackoffDuration = 30
    max_backoff: BackoffDuration = 900


def _reserved_env(name: str) -> bool:
    """Names the job's env may not set: what Isthmus gives the ranks, and the loader's hooks."""
    if name in ("LD_PRELOAD", "LD_AUDIT"):
        return True
    return name.startswith("ISTHMUS_") and not name.startswith("ISTHMUS_SIM_")


class JobSpec(_Strict):
    """A gang-scheduled training job, as submitted."""

    api_version: Literal["isthmus/v1"] = "isthmus/v1"
    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits and '-'")
    team: Name
    queue: Name = "default"
    priority: Name = "normal"
    gang: Gang
    flavors: list[Name] = Field(
        default_factory=list, max_length=Ceiling.FLAVORS,
        description="acceptable, preferred first",
    )
    constraints: FlavorConstraints | None = None
    topology: Topology = Field(default_factory=Topology)
    backend: Literal["slurm", "k8s", "any"] = "any"
    entrypoint: Entrypoint
    env: dict[
        Annotated[TextKey, Field(max_length=Ceiling.NAME_LENGTH * 4)],
        Annotated[MultilineText, Field(max_length=Ceiling.ENV_VALUE_LENGTH)],
    ] = Field(
        default_factory=dict, max_length=Ceiling.ENV_VARS,
        json_schema_extra=_keys(_ENV_KEY.pattern, Ceiling.NAME_LENGTH * 4),
    )
    mounts: list[Mount] = Field(default_factory=list, max_length=Ceiling.MOUNTS)
    max_runtime: RuntimeDuration = 86400
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    labels: dict[
        MetadataKey,
        Annotated[Text, Field(max_length=Ceiling.NAME_LENGTH)],
    ] = Field(
        default_factory=dict, max_length=Ceiling.METADATA_ENTRIES,
        json_schema_extra=_keys(_K8S_KEY, Ceiling.METADATA_KEY_LENGTH),
        description="added to the Job, its pods and its Service on Kubernetes (kept by Isthmus "
        "on Slurm); Kubernetes label syntax",
    )
    annotations: dict[
        MetadataKey, Annotated[MultilineText, Field(max_length=Ceiling.ANNOTATION_VALUE_LENGTH)]
    ] = Field(
        default_factory=dict, max_length=Ceiling.METADATA_ENTRIES,
        description="added to every pod on Kubernetes (ignored on Slurm)",
        json_schema_extra=_keys(_K8S_KEY, Ceiling.METADATA_KEY_LENGTH),
    )
    code_version: FreeText | None = None
    data_version: FreeText | None = None
    scheduling: Scheduling | None = Field(
        default=None, description="start time, dependencies, array membership (sbatch style)"
    )
    notify: JobNotify | None = Field(
        default=None, description="this job's own notices: webhooks, mail addresses, event "
        "kinds (isbatch --mail-user/--mail-type); the team's notices come from isthmus.yaml")
    native: NativeOptions | None = Field(
        default=None, description="backend-native options the team's policy allows "
        "(isthmus.yaml teams[].native): a Kubernetes pod template overlay (k8s.pod_template), "
        "extra sbatch options (slurm.options); each applies on its kind of backend only")

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
        reserved = sorted(k for k in v if _reserved_env(k))
        if reserved:
            raise ValueError(
                f"reserved variable name(s) {reserved}: Isthmus sets ISTHMUS_* for the ranks "
                "(the job's id, attempt, progress token, resume point; ISTHMUS_SIM_* are the "
                "simulator's and allowed), and LD_PRELOAD / LD_AUDIT would run code in every "
                "process of the job's image; remove them from env"
            )
        return v

    @field_validator("mounts")
    @classmethod
    def _unique_mount_paths(cls, v: list[Mount]) -> list[Mount]:
        paths = [m.path for m in v]
        dup = sorted({p for p in paths if paths.count(p) > 1})
        if dup:
            raise ValueError(f"each mount path may be used once; repeated: {dup}")
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
