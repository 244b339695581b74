"""An sbatch script on Kubernetes: the rendered pod entrypoint of every rank, run as a local
process with the rendered environment (the fake nodes run no containers). Each rank runs the
script, whose srun runs in the rank and whose scontrol names the gang's hosts: a torchrun-style
rendezvous check (rank id and master address written per rank) must agree across ranks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from backends.k8s.manifests import COMPLETION_INDEX, render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from tests.harness.k8s_requests import NAME, request

POOL = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})
SCRIPT = """#!/bin/bash
#SBATCH -N 3 --gres=gpu:h100:8
set -eu
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 -c 4 bash -c "echo \\$SLURM_PROCID \\$SLURM_NODEID $head_node \
\\$SLURM_NNODES \\$SLURM_NTASKS \\$SLURM_GPUS_ON_NODE \\$SLURM_JOB_NAME \
\\$SLURM_ARRAY_TASK_ID \\$MASTER_ADDR > $OUT/rank-\\$SLURM_PROCID"
"""


def _rank_env(container: dict[str, Any], index: int, out: Path) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(out), "OUT": str(out)}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:  # the progress token, from its Secret
            env[item["name"]] = "token-from-secret"
        else:  # the completion index, from the pod's annotation
            assert COMPLETION_INDEX in item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = str(index)
    return env


def test_every_rank_runs_the_script_with_slurm_env_and_shims(tmp_path: Path) -> None:
    req = request(replicas=3, entrypoint={"image": "trainer:1", "script": SCRIPT,
                                          "launcher": "batch"},
                  spec_env={"SLURM_ARRAY_TASK_ID": "4"})
    job = render(req, POOL, K8sSettings(namespace="train"))[0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/bash", "-c"]
    assert container["command"][-1].startswith("#!/bin/bash")  # the script is an argument
    procs = [subprocess.Popen(container["command"], env=_rank_env(container, i, tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    for p in procs:
        _out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    head = f"{NAME}-0.{NAME}"
    for i in range(3):
        got = (tmp_path / f"rank-{i}").read_text().split()
        assert got == [str(i), str(i), head, "3", "3", "8", "train", "4", head]


def test_srun_shim_refuses_an_empty_command_and_scontrol_only_lists_hosts(tmp_path: Path) -> None:
    script = "#!/bin/bash\nscontrol show job 1 || echo refused > $OUT/scontrol\nsrun -n 2\n"
    req = request(replicas=1, entrypoint={"image": "t:1", "script": script, "launcher": "batch"})
    (container,) = render(req, POOL, K8sSettings())[0]["spec"]["template"]["spec"]["containers"]
    proc = subprocess.run(container["command"], env=_rank_env(container, 0, tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "srun: error: no command given" in proc.stderr
    assert (tmp_path / "scontrol").read_text().strip() == "refused"


def test_several_tasks_a_node_run_as_srun_runs_them(tmp_path: Path) -> None:
    """sbatch -n 8 --ntasks-per-node=4 --gpus-per-task=1 on Kubernetes: two pods, and in each
    the script's srun starts four tasks with ranks 0-7 and a GPU each (before, one task a pod:
    the script's srun started 2 tasks in all, each seeing every GPU)."""
    script = """#!/bin/bash
srun bash -c 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $CUDA_VISIBLE_DEVICES" \
  > "$OUT/task-$SLURM_PROCID"'
"""
    req = request(replicas=2, gpus=4, entrypoint={"image": "trainer:1", "script": script,
                                                  "launcher": "batch"},
                  gang={"replicas": 2, "gpus_per_replica": 4, "one_per_node": True,
                        "tasks_per_replica": 4})
    job = render(req, POOL, K8sSettings(namespace="train"))[0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    procs = []
    for i in range(2):
        env = {**_rank_env(container, i, tmp_path), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
        procs.append(subprocess.Popen(container["command"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    tasks = sorted((tmp_path / f"task-{r}").read_text().split() for r in range(8))
    assert tasks == sorted([str(r), str(r % 4), "8", str(r % 4)] for r in range(8))
