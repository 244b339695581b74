"""sbatch's shapes kept (issue 28): the same script through isbatch (a real `isthmus server` on
the real local Slurm cluster) and through real sbatch, compared by what ran.

Before, `-N 2 --ntasks-per-node=1 --gres=gpu:a100:4` was packed onto one 8-GPU node (both
ranks saw all eight GPUs), and `-n 8 --ntasks-per-node=4 --gpus-per-task=1` became a gang of
two whose script's srun started 2 tasks instead of 8. Compared here, for each shape: the
batch step's node and task counts, the number of tasks the script's own srun started, how
many distinct nodes they ran on, tasks per node, and how many GPUs each task saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.dropins import isbatch
from tests.fixtures.slurm import SlurmCluster
from tests.harness.server import Server, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
COMPAT = {
    "default_partition": "a100",
    "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "slurm"}},
    "accounts": {"isthmus": "vision"},
    "gpu_types": {"a100": "a100-80g"},
}
BODY = """
echo "batch $SLURM_JOB_NUM_NODES $SLURM_NTASKS" > batch.txt
srun bash -c 'echo "$SLURM_PROCID $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"' > ranks.tmp
mv ranks.tmp ranks.txt
"""
SHAPES = {
    "two-nodes-four-gpus": "#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:a100:4",
    "eight-tasks-a-gpu-each": "#SBATCH -n 8 --ntasks-per-node=4 --gpus-per-task=1",
    "one-node-two-gpus": "#SBATCH -N 1 --gres=gpu:2",
    # -N 2 with 1, 2 and 8 GPUs a node (4 above); tasks a node with two GPUs each
    "two-nodes-one-gpu": "#SBATCH -N 2 --gres=gpu:1",
    "two-nodes-two-gpus": "#SBATCH --nodes=2 --gpus-per-node=2",
    "two-nodes-eight-gpus": "#SBATCH -N 2 --gres=gpu:a100:8",
    "four-tasks-two-gpus-each": "#SBATCH -N 1 --ntasks-per-node=4 --gpus-per-task=2",
}


@pytest.fixture
def server(slurm_cluster: SlurmCluster, tmp_path: Path, workdir: Path) -> Iterator[Server]:
    cfg = write_config(tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)],
                       slurm_pools(), slurm_compat=COMPAT)
    srv = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    yield srv
    srv.stop()


def _ran(where: Path) -> dict[str, object] | None:
    """What a finished run did, read from its files; None until both are written (ranks.txt
    appears whole, once the script's srun has ended)."""
    batch, ranks = where / "batch.txt", where / "ranks.txt"
    if not batch.exists() or not ranks.exists():
        return None
    rows = [line.split() for line in ranks.read_text().splitlines() if line.strip()]
    if not rows or not batch.read_text().strip():
        return None
    _, nodes, *tasks = batch.read_text().split()
    # sbatch leaves SLURM_NTASKS unset without -n (a task a node); Isthmus always sets it
    per_node = Counter(node for _, node, _ in rows)
    return {
        "batch nodes": nodes, "batch tasks": tasks[0] if tasks else nodes, "ranks": len(rows),
        "rank ids": sorted(int(r[0]) for r in rows), "distinct nodes": len(per_node),
        "tasks per node": sorted(per_node.values()),
        "gpus per task": sorted(0 if g == "none" else len(g.split(",")) for _, _, g in rows),
    }


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_isbatch_runs_the_shape_real_sbatch_runs(
        shape: str, server: Server, slurm_cluster: SlurmCluster, workdir: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n{SHAPES[shape]}\n#SBATCH -t 5 -A isthmus -p a100\n{BODY}")
    ours, theirs = workdir / "isthmus", workdir / "sbatch"
    for d in (ours, theirs):
        d.mkdir()
        d.chmod(0o777)
    env = {"ISTHMUS_URL": server.url, "HOME": str(tmp_path)}
    assert isbatch.run(["--parsable", f"--chdir={ours}", str(script)], env) == 0, \
        capsys.readouterr().err
    slurm_cluster.run(["sbatch", "--parsable", f"--chdir={theirs}", "-A", slurm_cluster.account,
                       str(script)])
    real = wait_until(lambda: _ran(theirs), 240, f"real sbatch's run of {shape}")
    got = wait_until(lambda: _ran(ours), 240, f"isbatch's run of {shape}")
    assert got == real, (shape, got, real)
