"""When a job may be considered at all: a start time, dependencies on other jobs, and its place
in a job array with a limit on running tasks (sbatch --begin, --dependency, --array=...%N).

These are holds, checked before admission (``policies.holds``): a held job waits with
BeginTimeNotReached, WaitingForDependency or JobArrayTaskLimit and takes no part in placement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DependencyKind = Literal["after", "afterany", "afterok", "afternotok", "singleton"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dependency(_Strict):
    kind: DependencyKind
    jobs: list[str] = Field(default_factory=list, max_length=1000,
                            description="Isthmus job ids (empty for singleton)")


class ArrayMember(_Strict):
    id: str = Field(min_length=1, max_length=32, description="the array's id, shared by its tasks")
    index: int = Field(ge=0, le=4_000_000)
    count: int = Field(ge=1, le=10_000, description="tasks in the array")
    limit: int | None = Field(default=None, ge=1, le=10_000,
                              description="running tasks at most (the %N)")


class Scheduling(_Strict):
    begin_at: datetime | None = Field(default=None, description="not considered before")
    dependencies: list[Dependency] = Field(default_factory=list, max_length=100)
    any_dependency: bool = Field(default=False, description="one satisfied is enough ('?')")
    array: ArrayMember | None = None
