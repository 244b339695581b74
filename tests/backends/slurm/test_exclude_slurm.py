"""On the real cluster, a job queued without nodes but with excluded nodes (as admission queues
one while a starving gang holds them: policies/queue_guard.py) never starts on them: on an
idle partition, with two nodes excluded, among them the node Slurm picks for the same job
without exclusions (run first), it runs on the third. CLI transport (slurmrestd pools do not
exclude).

The cluster has three a100 nodes of 8 GPUs (rack1: a100-1, a100-2; rack2: a100-3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.base import SubmitRequest
from backends.slurm import SlurmBackend
from broker.domain.attempts import Placement, RunSnapshot, backend_object_name
from broker.domain.facts import Phase
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from tests.fixtures.slurm import SlurmCluster
from tests.harness.slurm_backend import Jobs, make_backend, wait_fact
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm

POOL = "slurm-a100"


@pytest.fixture
def backend(slurm_cluster: SlurmCluster) -> Iterator[SlurmBackend]:
    be = make_backend(slurm_cluster, "cli")
    yield be
    be.close()


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster) -> Iterator[Jobs]:
    j = Jobs(slurm_cluster)
    yield j
    j.cleanup()


def idle_a100(cluster: SlurmCluster) -> None:
    def idle() -> bool:
        out = cluster.run(["squeue", "-h", "-p", "a100", "-t", "PD,R,CG,CF", "-o", "%i"]).stdout
        return not out.strip()

    wait_until(idle, timeout=600, interval=1, what="partition a100 idle")


def queued(jobs: Jobs, exclude: tuple[str, ...]) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": "exclude", "team": "vision", "flavors": ["a100-80g"],
        "gang": {"replicas": 1, "gpus_per_replica": 8},
        "entrypoint": {"command": ["/bin/true"]}, "max_runtime": "10m",
    })
    job_id = new_job_id()
    name = backend_object_name(job_id, 1)
    jobs.names.append(name)
    placement = Placement(backend="slurm", backend_instance="slurm-local", pool=POOL,
                          flavor="a100-80g", exclude_nodes=exclude)
    return SubmitRequest(job_id=job_id, attempt=1, name=name, snapshot=RunSnapshot.of(spec),
                         placement=placement)


def test_a_queued_job_never_starts_on_its_excluded_nodes(
    backend: SlurmBackend, jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    assert all(p.excludes_nodes for p in backend.inventory().pools)

    def run(exclude: tuple[str, ...]) -> tuple[str, ...]:
        idle_a100(slurm_cluster)
        req = queued(jobs, exclude)
        backend.submit(req)
        fact = wait_fact(backend, req.name, {Phase.SUCCEEDED, Phase.FAILED}, timeout=300)
        assert fact.phase is Phase.SUCCEEDED, fact
        return fact.nodes

    (first,) = run(())  # where Slurm starts it on an idle partition (seen: a100-3)
    left = "a100-2" if first != "a100-2" else "a100-1"  # a node Slurm did not pick
    exclude = tuple(sorted({"a100-1", "a100-2", "a100-3"} - {left}))
    assert first in exclude
    assert run(exclude) == (left,)
