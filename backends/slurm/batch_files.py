"""sbatch's --output/--error of a batch script (entrypoint.batch) as the #SBATCH paths."""

from __future__ import annotations

import dataclasses
import re

from backends.base import SubmitRequest, Unsupported
from backends.slurm.records import BatchJob

_USER_PATH = re.compile(r"^/[A-Za-z0-9._/%+@=,~-]*$")
_OUR_PATTERNS = re.compile(r"%%|%[jxAa]")
NO_ARRAY_INDEX = "4294967294"  # what Slurm writes for %a of a job that is not in an array


def user_path(pattern: str | None, request: SubmitRequest) -> str | None:
    """sbatch's --output/--error pattern with %j, %x, %A and %a as the user knows them: the
    job's number (the Isthmus id for an unnumbered job), the job's name, the array's id (else
    the job's) and the task's index (else Slurm's 4294967294). Other patterns (%N, %u, %n,
    ...) and %% are Slurm's."""
    if pattern is None:
        return None
    if not _USER_PATH.match(pattern):
        raise Unsupported(f"output/error path {pattern!r} is not an absolute path of "
                          "[A-Za-z0-9._/%+@=,~-]")
    spec = request.snapshot.spec
    array = spec.scheduling.array if spec.scheduling is not None else None
    values = {"%j": request.slurm_job_id, "%x": spec.name,
              "%A": array.id if array is not None else request.slurm_job_id,
              "%a": str(array.index) if array is not None else NO_ARRAY_INDEX, "%%": "%%"}
    path = _OUR_PATTERNS.sub(lambda m: values[m.group(0)], pattern)
    if not _USER_PATH.match(path):
        raise Unsupported(f"output/error path {path!r}: unsafe after expansion")
    return path


def with_batch_options(job: BatchJob, request: SubmitRequest) -> BatchJob:
    """The job with the spec's entrypoint.batch: output, error, exclusive."""
    batch = request.snapshot.spec.entrypoint.batch
    if batch is None:
        return job
    return dataclasses.replace(job, user_output=user_path(batch.output, request),
                               user_error=user_path(batch.error, request),
                               exclusive=batch.exclusive)
