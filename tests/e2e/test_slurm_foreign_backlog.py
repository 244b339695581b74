"""Queue depth that includes foreign load, on the real Slurm cluster: jobs submitted with plain
`sbatch` (not Isthmus's) wait in one partition's queue; of two pools of the same flavor that a
new gang fits in now, Isthmus places it on the other partition because of that backlog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import load_config
from broker.control.admission import run_admission
from broker.control.plane import ControlPlane
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store import open_database
from broker.wiring.runtime import build_backends, control_params
from tests.builders import spec
from tests.fixtures.slurm import SlurmCluster
from tests.harness.server import slurm_backend, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
FLAVOR = "a100-80g"  # both partitions serve as one flavor here: only the backlog differs
CAP = {"nodes": 3, "gpus_per_node": 8, "nodes_per_rack": 2, "racks_per_block": 2}
POOLS = [  # "a-busy" wins a tie by name: without the backlog the gang goes there
    {"name": "a-busy", "backend": "slurm-local", "partition": "a100", "flavor": FLAVOR,
     "capacity": CAP},
    {"name": "b-idle", "backend": "slurm-local", "partition": "h100", "flavor": FLAVOR,
     "capacity": CAP},
]


class Foreign:
    """Plain sbatch jobs (not Isthmus's), cancelled at the end whatever happens."""

    def __init__(self, slurm: SlurmCluster) -> None:
        self.slurm = slurm
        self.ids: list[str] = []

    def sbatch(self, *args: str) -> str:
        wrap = () if "--wrap" in args else ("--wrap", "sleep 1800")
        out = self.slurm.run(["sbatch", "--parsable", "-J", "user-training", "-t", "30",
                              *args, *wrap]).stdout
        job_id = out.strip().split(";")[0]
        self.ids.append(job_id)
        return job_id

    def state(self, job_id: str) -> tuple[str, str]:
        out = self.slurm.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False).stdout
        state, _, reason = out.strip().partition(" ")
        return state, reason

    def cancel(self) -> None:
        if self.ids:
            self.slurm.run(["scancel", *self.ids], check=False)
            wait_until(lambda: all(self.state(i)[0] in ("", "COMPLETING") for i in self.ids),
                       timeout=60, what="the foreign jobs to leave the queue")


@pytest.fixture
def foreign(slurm_cluster: SlurmCluster) -> Iterator[Foreign]:
    slurm_cluster.wait_idle(timeout=180)
    jobs = Foreign(slurm_cluster)
    try:
        yield jobs
    finally:
        jobs.cancel()


def _place(slurm: SlurmCluster, tmp_path: Path,
           run: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """A fresh broker over the real cluster admits one 1 x 8 GPU gang; where did it go, and
    what did the inventory say about each pool's queue?"""
    work = tmp_path / f"work-{run}"
    work.mkdir()
    cfg = load_config(write_config(tmp_path / f"{run}.yaml", [slurm_backend(slurm, work)], POOLS,
                                   flavors=[{"name": FLAVOR, "gpu_model": "any",
                                             "gpu_memory_gb": 80}],
                                   teams=[{"name": "vision",
                                           "quotas": {FLAVOR: {"nominal": 64}}}],
                                   cohorts=[],
                                   # a loaded machine answers sinfo/squeue slowly: wait for
                                   # the inventory rather than see the pools unavailable
                                   control={"inventory_wait": 60}))
    db = open_database(f"sqlite:///{tmp_path / f'{run}.db'}")
    plane = ControlPlane(db, cfg, build_backends(cfg), params=control_params(cfg))
    try:
        pools = {p.name: p for p in plane.inventory().pools}
        seen = {name: (p.free_gpus, p.queue.foreign_pending_gpus) for name, p in pools.items()}
        # no image: this cluster's Slurm backend runs none (containers on Slurm)
        job = submit_job(db, cfg, spec().team("vision").flavors(FLAVOR).replicas(1).gpus(8)
                         .backend("slurm").set("entrypoint", {"command": ["sleep", "1"]})
                         .build(), "t").job
        assert run_admission(plane).record.admitted == 1
        with db.read() as s:
            [attempt] = att.attempts_of(s, job.id)
        return attempt.pool, seen
    finally:
        db.dispose()


def test_a_foreign_sbatch_backlog_sends_the_gang_to_the_other_partition(
    slurm_cluster: SlurmCluster, foreign: Foreign, tmp_path: Path
) -> None:
    # foreign work holds one a100 node; the other two stay free for a 1 x 8 GPU gang
    running = foreign.sbatch("-p", "a100", "-N", "1", "--gres=gpu:a100:8")
    wait_until(lambda: foreign.state(running)[0] == "RUNNING", timeout=120,
               what="the foreign job to run")
    # work that can never run is no backlog: a job after one that failed (Slurm keeps it
    # pending for good with reason DependencyNeverSatisfied)
    failed = foreign.sbatch("-p", "a100", "-N", "1", "--gres=gpu:a100:1", "--wrap", "false")
    never = foreign.sbatch("-p", "a100", "-N", "3", "--gres=gpu:a100:8",
                           f"--dependency=afterok:{failed}")
    wait_until(lambda: foreign.state(never) == ("PENDING", "DependencyNeverSatisfied"),
               timeout=120, what="the dependent foreign job to be unsatisfiable")
    pool, seen = _place(slurm_cluster, tmp_path, "no-backlog")
    assert seen == {"a-busy": (16, 0), "b-idle": (24, 0)}
    assert pool == "a-busy"  # equal pools, no backlog: the tie goes by name

    # a foreign 3-node job waits behind it for all of a100: a backlog of 24 GPUs
    waiting = foreign.sbatch("-p", "a100", "-N", "3", "--gres=gpu:a100:8")
    wait_until(lambda: foreign.state(waiting) == ("PENDING", "Resources"), timeout=120,
               what="the foreign 3-node job to wait for resources")
    pool, seen = _place(slurm_cluster, tmp_path, "backlog")
    assert seen == {"a-busy": (16, 24), "b-idle": (24, 0)}
    assert pool == "b-idle"
