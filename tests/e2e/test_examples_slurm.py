"""The shipped examples run as they are: examples/jobs/sbatch-style.yaml, unchanged, through a
real `isthmus server` on examples/isthmus-local.yaml and the real local Slurm cluster, reaches
SUCCEEDED, and its script really ran (every rank's fit is in the job's output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.harness.paths import ROOT
from tests.harness.server import Server
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}


def _local_config(tmp_path: Path, slurm_cluster: Any, workdir: Path) -> Path:
    """examples/isthmus-local.yaml as shipped, pointed at this session's cluster (the same
    /tmp/isthmus-slurm unless ISTHMUS_SLURM_STATE moves it) and a job directory of the test."""
    data = yaml.safe_load((ROOT / "examples" / "isthmus-local.yaml").read_text())
    for backend in data["backends"]:
        if backend["kind"] == "slurm":
            backend["settings"]["slurm_conf"] = str(slurm_cluster.slurm_conf)
            backend["settings"]["work_dir"] = str(workdir)
    path = tmp_path / "isthmus-local.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_sbatch_style_example_succeeds_on_real_slurm(
        slurm_cluster: Any, tmp_path: Path, workdir: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "jobs" / "sbatch-style.yaml").read_text())
    cfg = _local_config(tmp_path, slurm_cluster, workdir)
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        job_id = server.submit(spec)["id"]
        job = wait_until(lambda: j if (j := server.job(job_id))["state"] in ENDED else None, 300,
                         "the example to end", interval=1)
        events = httpx.get(f"{server.url}/v1/jobs/{job_id}/events", timeout=30).json()
        assert job["state"] == "SUCCEEDED", (job, events, server.log.read_text()[-3000:])
        logs = httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", timeout=30)
        assert logs.status_code == 200, logs.text
        text = _all_text(logs.json())
        for rank in range(spec["gang"]["replicas"]):
            assert f"rank {rank} (GPUs " in text and f"rank {rank}" in text, text[-2000:]
        assert "epoch 20 loss" in text and "cfd-surrogate: done" in text, text[-2000:]
    finally:
        server.stop()


def _all_text(answer: Any) -> str:
    """Every log text in the logs answer, whatever its nesting (ranks, streams)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, dict):
        return "\n".join(_all_text(v) for v in answer.values())
    if isinstance(answer, list):
        return "\n".join(_all_text(v) for v in answer)
    return ""
