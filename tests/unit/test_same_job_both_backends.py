"""One job, rendered for both backends: the Kubernetes Indexed Job and the Slurm batch job
(container runtime `oci`) of the same spec, compared field by field through one mapping table.
The README's "Same job on both backends" table is this one; a row that differs says why.

What the Slurm rendering actually runs is tested on the real cluster
(tests/e2e/test_slurm_containers.py); here, the two rendered objects.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from backends.base import SubmitRequest
from backends.k8s.manifests import render as k8s_render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from backends.slurm.containers import ContainerSettings
from backends.slurm.records import BatchJob
from backends.slurm.script import RenderSettings, batch_job
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec

SPEC = {
    "name": "same", "team": "vision", "flavors": ["a100-80g"],
    "gang": {"replicas": 2, "gpus_per_replica": 4},
    "entrypoint": {"image": "registry.local/train:1.0",
                   "command": ["python3", "train.py", "--lr", "3e-4 x"]},
    "env": {"FOO": "bar baz", "SEED": "7"},
    "mounts": [{"name": "imagenet-22k", "path": "/data/in22k", "read_only": True}],
    "checkpoint": {"grace": 90}, "max_runtime": "61m",
}
K8S = K8sSettings(namespace="train", all_ranks_timeout_s=120)
POOL = K8sPoolBinding(name="k8s-a100", flavor="a100-80g",
                      node_selector={"isthmus.io/pool": "a100"})
SLURM = RenderSettings(container=ContainerSettings(
    runtime="oci", volumes={"imagenet-22k": "/lustre/in22k"}))


def _request(backend: str) -> SubmitRequest:
    spec = JobSpec.model_validate(SPEC)
    placement = Placement(backend=backend, backend_instance=f"{backend}-local",
                          pool=f"{backend}-a100", flavor="a100-80g",
                          nodes=("a100-1", "a100-2"))
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name="isthmus-01abcdefghjkmnpq-1",
                         snapshot=RunSnapshot.of(spec), placement=placement)


@dataclass(frozen=True)
class Rendered:
    job: dict[str, Any]  # Kubernetes: the Job
    batch: BatchJob  # Slurm: the batch job, its script with the container's files

    @property
    def pod(self) -> dict[str, Any]:
        return dict(self.job["spec"]["template"]["spec"])

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.pod["containers"][0])

    def slurm_file(self, name: str) -> str:
        """A base64 file the batch script writes into the job's directory."""
        m = re.search(rf'{re.escape(name)}" <<\'ISTHMUS_DATA_END\'\n(.*?)\nISTHMUS_DATA_END',
                      self.batch.script, re.S)
        assert m, name
        return base64.b64decode(m.group(1).replace("\n", "")).decode()

    @property
    def slurm_env(self) -> dict[str, str]:
        out = {}
        for line in self.slurm_file("job.env").splitlines():
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").partition("=")
                out[key] = shlex.split(value)[0] if value else ""
        return out

    @property
    def slurm_argv(self) -> list[str]:
        (line,) = [x for x in self.slurm_file("job.env").splitlines() if x.startswith("set -- ")]
        return shlex.split(line)[2:]

    @property
    def slurm_container(self) -> dict[str, Any]:
        return dict(json.loads(self.slurm_file("container.json")))


@pytest.fixture(scope="module")
def both() -> Rendered:
    (job,) = [m for m in k8s_render(_request("k8s"), POOL, K8S) if m["kind"] == "Job"]
    batch = batch_job(_request("slurm"), SLURM, partition="a100", gpu_type="a100")
    return Rendered(job, batch)


Getter = Callable[[Rendered], object]


@dataclass(frozen=True)
class Row:
    field: str
    k8s: Getter
    slurm: Getter
    why: str = ""  # empty: the two must be equal


def _k8s_env(r: Rendered) -> dict[str, str]:
    return {e["name"]: e["value"] for e in r.container["env"]
            if "value" in e and e["name"] in SPEC["env"]}


def _k8s_mounts(r: Rendered) -> list[tuple[str, bool]]:
    return [(m["mountPath"], m["readOnly"]) for m in r.container.get("volumeMounts", [])]


def _slurm_mounts(r: Rendered) -> list[tuple[str, bool]]:
    return [(b["target"], b["read_only"]) for b in r.slurm_container["binds"]
            if b["target"] != r.batch.work_dir]  # the job's own directory: Slurm only


def _k8s_ranks(r: Rendered) -> int:
    assert r.job["spec"]["completions"] == r.job["spec"]["parallelism"]
    return int(r.job["spec"]["completions"])


def _slurm_ranks(r: Rendered) -> int:
    assert f"--ntasks={r.batch.shape.replicas}" in r.batch.script
    return int(r.slurm_env["ISTHMUS_WORLD_SIZE"])


TABLE = [
    Row("entrypoint.image", lambda r: r.container["image"],
        lambda r: r.slurm_container["image"]),
    Row("entrypoint.command", lambda r: r.container["command"], lambda r: r.slurm_argv),
    Row("env", _k8s_env,
        lambda r: {k: v for k, v in r.slurm_env.items() if k in SPEC["env"]}),
    Row("gang.replicas (ranks)", _k8s_ranks, _slurm_ranks),
    Row("gang.gpus_per_replica",
        lambda r: int(r.container["resources"]["limits"]["nvidia.com/gpu"]),
        lambda r: r.batch.shape.gpus_per_replica),
    Row("mounts (path, read-only)", _k8s_mounts, _slurm_mounts),
    Row("checkpoint.grace (s)", lambda r: r.pod["terminationGracePeriodSeconds"],
        lambda r: int(str(r.batch.signal).rsplit("@", 1)[1])),
    Row("max_runtime", lambda r: r.job["spec"]["activeDeadlineSeconds"],
        lambda r: r.batch.time_limit_min,
        why="Kubernetes: seconds, plus all_ranks_timeout_s of start-up slack; Slurm: "
            "--time in whole minutes, rounded up"),
]


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.field)
def test_the_same_spec_renders_the_same_on_both_backends(both: Rendered, row: Row) -> None:
    k8s, slurm = row.k8s(both), row.slurm(both)
    if not row.why:
        assert k8s == slurm, (row.field, k8s, slurm)
        return
    spec = JobSpec.model_validate(SPEC)
    assert k8s == spec.max_runtime + K8S.all_ranks_timeout_s
    assert slurm == math.ceil(spec.max_runtime / 60)


def test_the_readme_table_lists_every_row() -> None:
    from tests.harness.paths import ROOT

    text = (ROOT / "README.md").read_text()
    section = text.split("### Same job on both backends", 1)[1].split("\n## ", 1)[0]
    for row in TABLE:
        assert f"| `{row.field}` |" in section, row.field
