"""The ``slurm_compat:`` section of isthmus.yaml: how sbatch words map onto Isthmus.

```yaml
slurm_compat:
  default_partition: a100
  partitions:                       # sbatch -p NAME -> acceptable flavors and backend
    a100: {flavors: [a100-80g], backend: any}     # Slurm partition a100 and k8s pools alike
    h100: {flavors: [h100-80g], backend: slurm}
  accounts: {vision: vision, nlp: language, vision-prod: vision/prod}  # sbatch -A -> team[/queue]
  default_accounts: {carol: nlp}                  # user -> account when no -A, no team
  qos: {normal: normal, high: high}               # sbatch -q -> priority class
  gpu_types: {a100: a100-80g, h100: h100-80g}     # --gres=gpu:TYPE:N -> flavor
  constraints: {a100: a100-80g, h100: h100-80g}   # -C FEATURE -> flavor
  image: registry.example/hpc/base:2026.11        # what the script runs in on Kubernetes
```

Anything a request names that the section does not map is refused with the list of what is
mapped, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PartitionMap(_Strict):
    flavors: list[str] = Field(min_length=1, description="acceptable flavors, preferred first")
    backend: Literal["slurm", "k8s", "any"] = "any"


class SlurmCompat(_Strict):
    default_partition: str | None = None
    partitions: dict[str, PartitionMap] = Field(default_factory=dict)
    accounts: dict[str, str] = Field(
        default_factory=dict,
        description="account -> team, or team/queue (a sub-account: one of the team's queues)")
    default_accounts: dict[str, str] = Field(
        default_factory=dict, max_length=100_000,
        description="user -> account for a request with no -A from a token with no team "
                    "(Slurm's DefaultAccount)")
    qos: dict[str, str] = Field(default_factory=dict, description="qos -> priority class")
    gpu_types: dict[str, str] = Field(default_factory=dict, description="gpu type -> flavor")
    constraints: dict[str, str] = Field(default_factory=dict, description="feature -> flavor")
    image: str | None = Field(default=None, min_length=1, max_length=512)
    default_time_limit_s: int = Field(default=3600, ge=60, description="when no --time is given")

    def problems(self, flavors: set[str], teams: Mapping[str, list[str]],
                 priorities: set[str]) -> list[str]:
        """References to names the rest of the configuration does not define (`teams`: each
        team's queue names)."""
        out = []
        for key, value in self.accounts.items():
            team, slash, queue = value.partition("/")
            if slash and team in teams and queue not in teams[team]:
                out.append(f"slurm_compat.accounts.{key}: team '{team}' has no queue "
                           f"'{queue}' (teams[].queues: {', '.join(teams[team])})")
        if self.default_partition and self.default_partition not in self.partitions:
            out.append(f"slurm_compat.default_partition: '{self.default_partition}' is not in "
                       "slurm_compat.partitions")
        for name, part in self.partitions.items():
            out += [f"slurm_compat.partitions.{name}.flavors: '{f}' is not in flavors"
                    for f in part.flavors if f not in flavors]
        for label, table, known, what in (
            ("accounts", {k: v.partition("/")[0] for k, v in self.accounts.items()},
             set(teams), "teams"),
            ("default_accounts", self.default_accounts, set(self.accounts),
             "slurm_compat.accounts"),
            ("qos", self.qos, priorities, "priority_classes"),
            ("gpu_types", self.gpu_types, flavors, "flavors"),
            ("constraints", self.constraints, flavors, "flavors"),
        ):
            out += [f"slurm_compat.{label}.{key}: '{value}' is not in {what}"
                    for key, value in table.items() if value not in known]
        return out
