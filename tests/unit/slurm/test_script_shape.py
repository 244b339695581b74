"""One rule for a gang's shape on Slurm: the placement's nodes -> tasks, nodes and GPUs, and the
same shape in the batch script's directives, its srun line and the slurmrestd body."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from backends.base import SubmitRequest, Unsupported
from backends.slurm.script import RenderSettings, batch_job
from backends.slurm.shape import GangShape, gang_shape
from backends.slurm.transport_rest import RestTransport
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec


@dataclass(frozen=True)
class Case:
    id: str
    replicas: int
    gpus: int
    nodes: tuple[str, ...]
    level: str | None
    shape: GangShape
    sbatch: dict[str, str]  # expected #SBATCH options (absent keys: must not be there)
    srun: str
    rest: dict[str, object]


CASES = [
    Case("1x8", 1, 8, ("n1",), "node",
         GangShape(1, 8, 1, 1, ("n1",)),
         {"--nodes": "1", "--ntasks": "1", "--ntasks-per-node": "1", "--gres": "gpu:a100:8",
          "--nodelist": "n1"},
         "--ntasks=1 --nodes=1 --ntasks-per-node=1 --gpu-bind=per_task:8",
         {"nodes": 1, "tasks": 1, "tasks_per_node": 1, "gres": "gpu:a100:8"}),
    Case("2x4-one-node", 2, 4, ("n1", "n1"), "node",
         GangShape(2, 4, 1, 2, ("n1",)),
         {"--nodes": "1", "--ntasks": "2", "--ntasks-per-node": "2", "--gres": "gpu:a100:8",
          "--nodelist": "n1"},
         "--ntasks=2 --nodes=1 --ntasks-per-node=2 --gpu-bind=per_task:4",
         {"nodes": 1, "tasks": 2, "tasks_per_node": 2, "gres": "gpu:a100:8"}),
    Case("4x2-one-node", 4, 2, ("n2",) * 4, "node",
         GangShape(4, 2, 1, 4, ("n2",)),
         {"--nodes": "1", "--ntasks": "4", "--ntasks-per-node": "4", "--gres": "gpu:a100:8",
          "--nodelist": "n2"},
         "--ntasks=4 --nodes=1 --ntasks-per-node=4 --gpu-bind=per_task:2",
         {"nodes": 1, "tasks": 4, "tasks_per_node": 4, "gres": "gpu:a100:8"}),
    Case("2x8-two-nodes", 2, 8, ("n1", "n2"), "rack",
         GangShape(2, 8, 2, 1, ("n1", "n2")),
         {"--nodes": "2", "--ntasks": "2", "--ntasks-per-node": "1", "--gres": "gpu:a100:8",
          "--nodelist": "n1,n2", "--switches": "1", "--constraint": "rack1"},
         "--ntasks=2 --nodes=2 --ntasks-per-node=1 --gpu-bind=per_task:8",
         {"nodes": 2, "tasks": 2, "tasks_per_node": 1, "gres": "gpu:a100:8",
          "constraints": "rack1"}),
    Case("3x8-three-nodes", 3, 8, ("n3", "n1", "n2"), None,
         GangShape(3, 8, 3, 1, ("n3", "n1", "n2")),
         {"--nodes": "3", "--ntasks": "3", "--ntasks-per-node": "1", "--gres": "gpu:a100:8",
          "--nodelist": "n3,n1,n2"},
         "--ntasks=3 --nodes=3 --ntasks-per-node=1 --gpu-bind=per_task:8",
         {"nodes": 3, "tasks": 3, "tasks_per_node": 1, "gres": "gpu:a100:8"}),
    Case("4x4-two-per-node", 4, 4, ("n1", "n1", "n2", "n2"), "rack",
         GangShape(4, 4, 2, 2, ("n1", "n2")),
         {"--nodes": "2", "--ntasks": "4", "--ntasks-per-node": "2", "--gres": "gpu:a100:8",
          "--nodelist": "n1,n2", "--switches": "1", "--constraint": "rack1"},
         "--ntasks=4 --nodes=2 --ntasks-per-node=2 --gpu-bind=per_task:4",
         {"nodes": 2, "tasks": 4, "tasks_per_node": 2, "gres": "gpu:a100:8",
          "constraints": "rack1"}),
    Case("3x4-mixed-two-nodes", 3, 4, ("n1", "n1", "n2"), "rack",
         GangShape(3, 4, 2, None, ("n1", "n2")),
         {"--nodes": "2", "--ntasks": "3", "--gpus-per-task": "a100:4", "--nodelist": "n1,n2",
          "--switches": "1", "--constraint": "rack1"},
         "--ntasks=3 --nodes=2 --gpu-bind=per_task:4",
         {"nodes": 2, "tasks": 3, "gpus_per_task": "a100:4", "constraints": "rack1"}),
    Case("2x4-no-nodes", 2, 4, (), None,
         GangShape(2, 4, None, None),
         {"--ntasks": "2", "--gpus-per-task": "a100:4"},
         "--ntasks=2 --gpu-bind=per_task:4",
         {"tasks": 2, "gpus_per_task": "a100:4"}),
    Case("2x4-no-nodes-one-node", 2, 4, (), "node",
         GangShape(2, 4, 1, 2),
         {"--nodes": "1", "--ntasks": "2", "--ntasks-per-node": "2", "--gres": "gpu:a100:8"},
         "--ntasks=2 --nodes=1 --ntasks-per-node=2 --gpu-bind=per_task:4",
         {"nodes": 1, "tasks": 2, "tasks_per_node": 2, "gres": "gpu:a100:8"}),
    Case("2x8-no-nodes-rack", 2, 8, (), "rack",
         GangShape(2, 8, None, None),
         {"--ntasks": "2", "--gpus-per-task": "a100:8", "--switches": "1",
          "--constraint": "rack1"},
         "--ntasks=2 --gpu-bind=per_task:8",
         {"tasks": 2, "gpus_per_task": "a100:8", "constraints": "rack1"}),
]
SHAPE_KEYS = ("--nodes", "--ntasks", "--ntasks-per-node", "--gres", "--gpus-per-node",
              "--gpus-per-task", "--nodelist", "--switches", "--constraint")
REST_KEYS = ("nodes", "tasks", "tasks_per_node", "gres", "gpus_per_node", "gpus_per_task",
             "constraints")


def _request(case: Case, **gang: object) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": "train", "team": "vision", "flavors": ["a100-80g"],
        "gang": {"replicas": case.replicas, "gpus_per_replica": case.gpus, **gang},
        "entrypoint": {"command": ["python", "train.py"]}, "max_runtime": "1h",
    })
    placement = Placement(backend="slurm", backend_instance="s", pool="slurm-a100",
                          flavor="a100-80g", topology_level=case.level,
                          topology_domain="spine/rack1" if case.level == "rack" else None,
                          nodes=case.nodes)
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name="isthmus-01abcdefghjkmnpq-1",
                         snapshot=RunSnapshot.of(spec), placement=placement)


def _sbatch(script: str) -> dict[str, str]:
    opts = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            opts[key] = value
    return opts


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gang_shape_rule(case: Case) -> None:
    shape = gang_shape(case.replicas, case.gpus, case.nodes, one_node=case.level == "node")
    assert shape == case.shape


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_batch_script_asks_for_the_shape(case: Case) -> None:
    job = batch_job(_request(case), RenderSettings(rack_features=True), partition="a100",
                    gpu_type="a100")
    opts = _sbatch(job.script)
    assert {k: opts[k] for k in SHAPE_KEYS if k in opts} == case.sbatch
    (srun,) = [line for line in job.script.splitlines() if line.startswith("srun ")]
    assert srun.startswith(f"srun {case.srun} --kill-on-bad-exit=1 ")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rest_body_asks_for_the_same_shape(case: Case) -> None:
    job = batch_job(_request(case), RenderSettings(rack_features=True), partition="a100",
                    gpu_type="a100")
    rest = RestTransport(url="http://slurmrestd.invalid", user="u", token="t",
                         version="v0.0.38")
    props = rest.submit_body(job)["job"]
    assert {k: props[k] for k in REST_KEYS if k in props} == case.rest


def test_newer_rest_dialect_asks_gpus_as_tres() -> None:
    mixed, uniform = CASES[6], CASES[1]
    rest = RestTransport(url="http://slurmrestd.invalid", user="u", token="t",
                         version="v0.0.42", allow_untested_version=True)
    settings = RenderSettings(rack_features=True)
    body = rest.submit_body(batch_job(_request(mixed), settings, partition="a100",
                                      gpu_type="a100"))["job"]
    assert body["tres_per_task"] == "gres/gpu:a100:4" and "gres" not in body
    body = rest.submit_body(batch_job(_request(uniform), settings, partition="a100",
                                      gpu_type="a100"))["job"]
    assert body["tres_per_node"] == "gres/gpu:a100:8" and body["tasks_per_node"] == 2


@pytest.mark.parametrize(("case", "per_node", "per_gpu"), [
    (CASES[1], "2048M", None),  # 2 x 1 GiB on one node
    (CASES[3], "1024M", None),
    (CASES[6], None, "256M"),  # mixed: 1 GiB per replica of 4 GPUs
    (CASES[7], None, "256M"),
])
def test_memory_follows_the_shape(case: Case, per_node: str | None, per_gpu: str | None) -> None:
    job = batch_job(_request(case, memory_per_replica="1Gi"), RenderSettings(),
                    partition="a100", gpu_type="a100")
    opts = _sbatch(job.script)
    assert (opts.get("--mem"), opts.get("--mem-per-gpu")) == (per_node, per_gpu)


def test_a_multi_replica_gang_at_node_level_is_one_node_not_a_refusal() -> None:
    job = batch_job(_request(CASES[1]), RenderSettings(), partition="a100")
    assert job.shape.nodes == 1 and job.shape.tasks_per_node == 2


@pytest.mark.parametrize(("nodes", "level", "match"), [
    (("n1",), None, "names 1 node"),
    (("n1", "n2"), "node", "spreads a one-node gang"),
])
def test_placements_that_contradict_the_gang_are_refused(
    nodes: tuple[str, ...], level: str | None, match: str
) -> None:
    with pytest.raises(Unsupported, match=match):
        gang_shape(2, 4, nodes, one_node=level == "node")


def test_a_node_per_replica_and_several_tasks_each() -> None:
    """sbatch -n 8 --ntasks-per-node=4 --gpus-per-task=1 as a gang: 2 replicas, a node each,
    4 tasks each sharing 4 GPUs: 8 tasks, 4 a node, each bound to one GPU, in the script, the
    srun line and the slurmrestd body; and -N 2 left to Slurm's placement asks for 2 nodes."""
    case = Case("2x4-t4", 2, 4, ("n1", "n2"), None, GangShape(2, 4, 2, 1, ("n1", "n2"), 4),
                {}, "", {})
    shape = gang_shape(2, 4, ("n1", "n2"), one_per_node=True, tasks_per_replica=4)
    assert shape == case.shape and (shape.ntasks, shape.ntasks_per_node) == (8, 4)
    request = _request(case, one_per_node=True, tasks_per_replica=4)
    job = batch_job(request, RenderSettings(), partition="a100", gpu_type="a100")
    opts = _sbatch(job.script)
    assert {k: opts.get(k) for k in ("--nodes", "--ntasks", "--ntasks-per-node",
                                      "--gpus-per-task", "--gpu-bind", "--gres")} == {
        "--nodes": "2", "--ntasks": "8", "--ntasks-per-node": "4",
        "--gpus-per-task": "a100:1", "--gpu-bind": "per_task:1", "--gres": None}
    (srun,) = [line for line in job.script.splitlines() if line.startswith("srun ")]
    assert "--ntasks=8 --nodes=2 --ntasks-per-node=4 --gpu-bind=per_task:1" in srun
    rest = RestTransport(url="http://slurmrestd.invalid", user="u", token="t",
                         version="v0.0.38").submit_body(job)["job"]
    assert (rest["tasks"], rest["tasks_per_node"]) == (8, 4)
    # -N 2 with no nodes named: Slurm places it, two nodes, a replica each
    assert gang_shape(2, 4, (), one_per_node=True) == GangShape(2, 4, 2, 1)
    with pytest.raises(Unsupported, match="two replicas of a one-per-node gang"):
        gang_shape(2, 4, ("n1", "n1"), one_per_node=True)
