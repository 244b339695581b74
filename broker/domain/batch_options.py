"""The sbatch options of a batch script that take effect (JobSpec.entrypoint.batch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


BATCH_PATH = r"^/[A-Za-z0-9._/%+@=,~-]*$"


class BatchOptions(_Strict):
    """sbatch options of a batch script (launcher 'batch') that take effect on Slurm: the
    output and error files (sbatch's patterns; %j, %x, %A and %a become the job's number, the
    job's name, the array's id and the task's index, the other patterns are Slurm's) and whole
    nodes (--exclusive). Kubernetes keeps them in the spec only (README, HPC section)."""

    output: str | None = Field(default=None, max_length=1024, pattern=BATCH_PATH,
                               description="absolute path pattern of the script's stdout")
    error: str | None = Field(default=None, max_length=1024, pattern=BATCH_PATH,
                              description="absolute path pattern of the script's stderr")
    exclusive: bool = Field(default=False, description="the job's nodes are its alone")

    @field_validator("output", "error")
    @classmethod
    def _no_climbing(cls, v: str | None) -> str | None:
        """A path that climbs ('..') could land anywhere the batch step may write (as the
        broker's account where jobs do not run as their owners): refused, not resolved."""
        if v is not None and ".." in v.split("/"):
            raise ValueError(f"{v}: a path with '..' is refused; write the directory itself")
        return v
