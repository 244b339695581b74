"""Transport-neutral records: what the CLI and slurmrestd transports both return.

Each transport parses its own output into these; everything above the transports (inventory,
classification, the adapter) reads only these records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from backends.slurm.shape import GangShape


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    partitions: tuple[str, ...]
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, NOT_RESPONDING, MAINTENANCE, ...
    reason: str = ""
    gpu_type: str = ""
    gpus: int = 0
    gpus_used: int = 0
    cpus: int = 0
    cpus_used: int = 0
    memory_mb: int = 0
    memory_used_mb: int = 0
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node state change that slurmdbd recorded (down, drain, fail), with its reason."""

    node: str
    state: str  # base state, lower case: down, drain, fail, ...
    flags: frozenset[str] = frozenset()  # upper case: NOT_RESPONDING, DRAIN, ...
    reason: str = ""
    start: datetime | None = None
    end: datetime | None = None  # None: not over when it was read


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    level: int
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job as seen by squeue, sacct or slurmrestd."""

    job_id: str
    name: str
    state: str  # base state, upper case: PENDING, RUNNING, FAILED, CANCELLED, ...
    reason: str = ""  # pending / end reason as Slurm gives it ("Resources", "None", ...)
    exit_code: int | None = None  # None: no trustworthy evidence
    signal: int | None = None
    nodes: tuple[str, ...] = ()
    partition: str = ""
    gpus: int = 0  # GPUs requested in total (all nodes)
    node_count: int = 0
    comment: str = ""
    user: str = ""
    cancelled_by: str | None = None  # uid or user name from "CANCELLED by N"
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    time_limit_s: int | None = None
    source: str = "queue"  # "queue" (squeue / slurmctld) or "accounting" (sacct / slurmdbd)
    flags: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class BatchJob:
    """A rendered batch job. ``script`` is complete (its #SBATCH lines carry every option, for
    sbatch); the fields repeat those options for slurmrestd, which ignores #SBATCH lines."""

    name: str
    script: str
    comment: str
    partition: str
    shape: GangShape  # tasks, nodes and GPUs: the one rule in shape.py
    gpu_type: str  # "" when untyped
    gpu_request: str  # per-node GPUs as "gres" (--gres=gpu:T:N) or "gpus-per-node"
    time_limit_min: int
    output: str
    work_dir: str
    signal: str | None = None  # "B:USR1@120"
    switches: int | None = None
    rack: str | None = None  # rack named by the placement, e.g. "rack1"
    constraint: str | None = None
    cpus_per_task: int | None = None
    memory_mb: int | None = None  # per node (uniform layouts)
    memory_per_gpu_mb: int | None = None  # per GPU (GPUs asked per task)
    hold: bool = False
    begin: str | None = None  # e.g. "now+1day" (benchmarks keep jobs pending this way)
    account: str | None = None  # the team's Slurm account (also an #SBATCH line)
    user_output: str | None = None  # sbatch's --output of a batch script (replaces `output`)
    user_error: str | None = None  # sbatch's --error of a batch script
    exclusive: bool = False  # whole nodes (sbatch --exclusive)
    exclude: tuple[str, ...] = ()  # nodes it must not start on (sbatch --exclude)
    native: tuple[tuple[str, str | None], ...] = ()  # the job's native.slurm.options but
    # --constraint (ANDed into `constraint`): (name, value), e.g. ("qos", "high")


def newest(records: Sequence[SlurmJob]) -> SlurmJob:
    """The record of the latest submission (the highest job id)."""
    return max(records, key=lambda r: int(r.job_id) if r.job_id.isdigit() else 0)


TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
                      "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE", "REVOKED"})
"""Slurm job states after which the job runs no more."""
