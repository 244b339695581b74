"""isbatch on the real local Kubernetes control plane: an #SBATCH script whose partition maps to a
Kubernetes pool is submitted with isbatch to a real `isthmus server`, its gang runs on the fake
nodes and the job reaches SUCCEEDED; `logs` has one entry per rank's pod. The fake nodes run no
containers, so the script's own output is shown by running each rank's pod command, as the
attempt rendered it (`GET .../render`), as a local process with the pod's environment."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from broker.dropins import isbatch
from tests.harness.server import Server, k8s_backend, k8s_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
SCRIPT = """#!/bin/bash
#SBATCH -J k8s-sbatch
#SBATCH -p a100
#SBATCH -N 2
#SBATCH --gres=gpu:a100:8
#SBATCH -t 10
set -eu
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c 'echo "rank $SLURM_PROCID of $SLURM_NTASKS on node $SLURM_NODEID, \
gpus $SLURM_GPUS_ON_NODE, job $SLURM_JOB_NAME"'
echo "head $head_node"
"""
COMPAT = {"default_partition": "a100",
          "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "k8s"}},
          "accounts": {"vision": "vision"}, "gpu_types": {"a100": "a100-80g"},
          "image": "python:3.12-slim"}


def _rank_env(container: dict[str, Any], index: int, home: Path) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = "token-from-secret"
        else:  # the completion index, from the pod's annotation
            env[item["name"]] = str(index)
    return env


def test_an_sbatch_script_runs_on_kubernetes_through_isbatch(
        k8s_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = "isthmus-e2e-isbatch"
    backend = k8s_backend(k8s_cluster, namespace)  # fake pods end after 3 s, exit 0
    cfg = write_config(tmp_path / "isthmus.yaml", [backend], k8s_pools(), slurm_compat=COMPAT)
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        script = tmp_path / "train.sh"
        script.write_text(SCRIPT)
        env = {"ISTHMUS_URL": server.url, "HOME": str(tmp_path)}
        assert isbatch.run(["-A", "vision", str(script)], env) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert out.startswith("Submitted batch job "), out
        job_id = out.split()[-1]
        job = wait_until(lambda: j if (j := server.job(job_id))["state"] in ENDED else None, 180,
                         "the job to end", interval=1)
        assert job["state"] == "SUCCEEDED", (job, server.log.read_text()[-3000:])
        attempts = httpx.get(f"{server.url}/v1/jobs/{job_id}/attempts", timeout=30).json()
        assert attempts[-1]["pool"] == "k8s-a100", attempts[-1]

        logs = httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", timeout=30)
        assert logs.status_code == 200, logs.text
        entries = logs.json()["ranks"]
        assert sorted(e["rank"] for e in entries) == [0, 1], entries
        for e in entries:  # kwok's nodes have no kubelet to serve a log, and say so
            assert e["source"].startswith("pod ") and (e["text"] or e["note"]), e

        rendered = httpx.get(f"{server.url}/v1/jobs/{job_id}/attempts/1/render", timeout=30)
        assert rendered.status_code == 200, rendered.text
        (kjob,) = [d for d in yaml.safe_load_all(rendered.text) if d and d["kind"] == "Job"]
        (container,) = kjob["spec"]["template"]["spec"]["containers"]
        assert "#SBATCH -N 2" in container["command"][-1]  # the script, as written
        ranks = [subprocess.run(container["command"], env=_rank_env(container, i, tmp_path),
                                capture_output=True, text=True, timeout=60) for i in range(2)]
        for i, r in enumerate(ranks):
            assert r.returncode == 0, r.stderr
            assert f"rank {i} of 2 on node {i}, gpus 8, job k8s-sbatch" in r.stdout, r.stdout
            assert "head " in r.stdout and "-0." in r.stdout, r.stdout  # rank 0's stable name
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            k8s_cluster.delete_namespace(namespace)
