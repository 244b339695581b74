"""Gangs of every shape run on the real cluster, once per transport (CLI and slurmrestd).

Each gang is placed by the admission policy itself (``policies.placement.place`` on the
backend's own inventory), submitted through SlurmBackend, and every rank writes what it saw
(rank, local rank, node, CUDA_VISIBLE_DEVICES, ...) into the job's directory. The ranks must be
0..R-1 with the placement's number of replicas on each node, each on its own GPUs.

The cluster has three a100 nodes of 8 GPUs (rack1: a100-1, a100-2; rack2: a100-3), so 3 x 8
fills the partition; each test waits for the partition to be idle first.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backends.base import SubmitRequest
from backends.slurm import SlurmBackend
from broker.domain.attempts import Placement, RunSnapshot, backend_object_name
from broker.domain.facts import Phase
from broker.domain.ids import new_job_id
from broker.domain.spec import Entrypoint, JobSpec, TopologyLevel
from policies.capacity import CapacityIndex
from policies.placement import place
from policies.types import PendingJob
from tests.fixtures.slurm import SlurmCluster
from tests.harness.slurm_backend import Jobs, make_backend, wait_fact
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm

POOL = "slurm-a100"
# Every rank writes rank-<RANK>.json into the job's directory, then exits 0.
PROBE = (
    "import json, os; e = os.environ; keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
    "'LOCAL_WORLD_SIZE', 'NODE_RANK', 'NNODES', 'GPUS_PER_NODE', 'MASTER_ADDR', "
    "'SLURMD_NODENAME', 'CUDA_VISIBLE_DEVICES'); "
    "p = os.path.join(e['ISTHMUS_JOB_DIR'], 'rank-' + e['RANK'] + '.json'); "
    "json.dump({k: e.get(k) for k in keys}, open(p + '.tmp', 'w')); os.rename(p + '.tmp', p)"
)


@dataclass(frozen=True)
class Gang:
    id: str
    replicas: int
    gpus: int
    admitted: bool = True  # False: placed without nodes, as a gang queued in Slurm would be
    level: TopologyLevel | None = None  # expected topology level of the placement


GANGS = [
    Gang("1x8", 1, 8, level=TopologyLevel.NODE),
    Gang("2x4", 2, 4, level=TopologyLevel.NODE),
    Gang("4x2", 4, 2, level=TopologyLevel.NODE),
    Gang("2x8", 2, 8, level=TopologyLevel.RACK),
    Gang("3x8", 3, 8, level=TopologyLevel.BLOCK),  # two racks: one block, "cluster"
    Gang("3x4-mixed", 3, 4, level=TopologyLevel.RACK),
    Gang("2x4-queued", 2, 4, admitted=False),
]


@pytest.fixture(params=["cli", "rest"])
def backend(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> Iterator[SlurmBackend]:
    be = make_backend(slurm_cluster, request.param)
    yield be
    be.close()


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster) -> Iterator[Jobs]:
    j = Jobs(slurm_cluster)
    yield j
    j.cleanup()


def idle_a100(cluster: SlurmCluster, backend: SlurmBackend) -> None:
    """Wait (generously: the cluster is shared) until no job holds or waits for a100 GPUs."""
    def idle() -> bool:
        out = cluster.run(["squeue", "-h", "-p", "a100", "-t", "PD,R,CG,CF", "-o", "%i"]).stdout
        if out.strip():
            return False
        pool = backend.inventory().pool(POOL)
        return pool is not None and all(n.free_gpus == n.total_gpus for n in pool.nodes)

    wait_until(idle, timeout=600, interval=1, what="partition a100 idle")


def admitted_placement(backend: SlurmBackend, gang: Gang) -> Placement:
    """The placement admission makes for this gang on the backend's inventory now."""
    job = PendingJob(id=new_job_id(), team="vision", replicas=gang.replicas,
                     gpus_per_replica=gang.gpus, flavors=("a100-80g",),
                     submitted_at=datetime.now(UTC))
    index = CapacityIndex(backend.inventory())
    result = place(job, index, pools=[index.pools[POOL]])
    assert result.placement is not None and result.fit is not None, result
    return result.placement


def request_for(jobs: Jobs, gang: Gang, placement: Placement) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": f"shape-{gang.id}", "team": "vision", "flavors": ["a100-80g"],
        "gang": {"replicas": gang.replicas, "gpus_per_replica": gang.gpus},
        "entrypoint": {"command": ["/usr/bin/python3", "-c", PROBE]},
        "max_runtime": "10m",
    })
    job_id = new_job_id()
    name = backend_object_name(job_id, 1)
    jobs.names.append(name)
    return SubmitRequest(job_id=job_id, attempt=1, name=name, snapshot=RunSnapshot.of(spec),
                         placement=placement)


def rank_reports(job_dir: Path, replicas: int) -> list[dict[str, Any]]:
    def all_written() -> list[Path] | None:
        files = sorted(job_dir.glob("rank-*.json"))
        return files if len(files) >= replicas else None

    files = wait_until(all_written, timeout=30, interval=0.5, what=f"rank files in {job_dir}")
    return [json.loads(f.read_text()) for f in files]


def run_and_check(backend: SlurmBackend, jobs: Jobs, gang: Gang, placement: Placement) -> None:
    """Submit, see SUCCEEDED, and check every rank's report against the placement."""
    req = request_for(jobs, gang, placement)
    job = backend.batch_job(req)
    backend.submit(req)
    fact = wait_fact(backend, req.name, {Phase.SUCCEEDED, Phase.FAILED}, timeout=300)
    assert fact.phase is Phase.SUCCEEDED, (fact, job.script)

    reports = rank_reports(Path(job.work_dir), gang.replicas)
    r, g = gang.replicas, gang.gpus
    assert sorted(int(x["RANK"]) for x in reports) == list(range(r)), reports
    assert {x["WORLD_SIZE"] for x in reports} == {str(r)}
    per_node = Counter(x["SLURMD_NODENAME"] for x in reports)
    assert set(per_node) <= set(fact.nodes), (per_node, fact.nodes)
    if job.shape.nodes is not None:
        assert len(per_node) == job.shape.nodes, per_node
    if placement.nodes and backend.transport.kind == "cli":
        # the CLI pins the placement's nodes; slurmrestd v0.0.38 has no field for that
        assert per_node == Counter(placement.nodes), (per_node, placement.nodes)
    elif placement.nodes:
        assert sorted(per_node.values()) == sorted(Counter(placement.nodes).values()), per_node
    node_ranks = {}
    for node, k in per_node.items():
        mine = [x for x in reports if x["SLURMD_NODENAME"] == node]
        assert sorted(int(x["LOCAL_RANK"]) for x in mine) == list(range(k)), mine
        assert {(x["LOCAL_WORLD_SIZE"], x["GPUS_PER_NODE"], x["NNODES"]) for x in mine} == {
            (str(k), str(k * g), str(len(per_node)))}, mine
        (node_ranks[node],) = {x["NODE_RANK"] for x in mine}
        gpu_sets = [frozenset((x["CUDA_VISIBLE_DEVICES"] or "").split(",")) - {""}
                    for x in mine]
        assert all(len(s) == g for s in gpu_sets), mine
        assert len(frozenset().union(*gpu_sets)) == k * g, f"ranks share GPUs on {node}: {mine}"
    assert sorted(int(v) for v in node_ranks.values()) == list(range(len(per_node)))
    assert {x["MASTER_ADDR"] for x in reports} == {fact.nodes[0]}


@pytest.mark.parametrize("gang", GANGS, ids=lambda g: g.id)
def test_gang_of_any_shape_runs_one_rank_per_replica_on_its_own_gpus(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster, gang: Gang
) -> None:
    idle_a100(slurm_cluster, backend)
    if gang.admitted:
        placement = admitted_placement(backend, gang)
        assert placement.topology_level == gang.level, placement
        assert len(placement.nodes) == gang.replicas
    else:
        placement = Placement(backend="slurm", backend_instance="slurm-local", pool=POOL,
                              flavor="a100-80g")
    run_and_check(backend, jobs, gang, placement)


def test_mixed_gang_beside_a_busy_node_gets_the_placements_split(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    """With 4 GPUs of a100-1 in use, admission puts one replica of 3 x 4 there and two on a
    node of its rack; Slurm must lay the tasks out the same way on those nodes. (The hog is
    cancelled with the test's other jobs.)"""
    idle_a100(slurm_cluster, backend)
    hog_gang = Gang("hog", 1, 4)
    hog = request_for(jobs, hog_gang, Placement(
        backend="slurm", backend_instance="slurm-local", pool=POOL, flavor="a100-80g",
        topology_level=TopologyLevel.NODE, nodes=("a100-1",)))
    hog = dataclasses.replace(hog, snapshot=hog.snapshot.model_copy(update={
        "spec": hog.snapshot.spec.model_copy(update={"entrypoint": Entrypoint(
            command=("sleep", "300"))})}))
    pinning = make_backend(slurm_cluster, "cli")  # slurmrestd v0.0.38 cannot pin a node
    try:
        pinning.submit(hog)
        wait_fact(pinning, hog.name, {Phase.RUNNING}, timeout=120)
    finally:
        pinning.close()

    def busy() -> Placement | None:  # the inventory shows the hog's GPUs in use
        pool = backend.inventory().pool(POOL)
        used = {n.name: n.total_gpus - n.free_gpus for n in pool.nodes} if pool else {}
        return admitted_placement(backend, gang) if used.get("a100-1") == 4 else None

    gang = Gang("3x4-busy", 3, 4)
    placement = wait_until(busy, timeout=60, interval=1, what="a100-1 half used")
    assert Counter(placement.nodes) == {"a100-1": 1, "a100-2": 2}, placement
    assert placement.topology_level is TopologyLevel.RACK  # so slurmrestd keeps it in rack1
    run_and_check(backend, jobs, gang, placement)
