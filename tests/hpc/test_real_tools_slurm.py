"""Real workflow tools, installed from PyPI and run unchanged, with `isthmus hpc shims` first on
PATH, against a real server whose backend is the real local Slurm cluster (issue 28).

Everything is real here: the tool's sbatch command line and its parsing of what the drop-ins
print, the broker's mapping and lifecycle, Slurm running the job's batch script on a node (the
test nodes are this machine), the job's own `srun`, and the tool getting its result back: the
Snakemake rules' files, written by the jobs, and the value of a Parsl app computed in a worker
that the Slurm job started and that called back to Parsl's interchange.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.slurm import SlurmCluster
from tests.harness.server import Server, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
TOKEN = "tok-vision-tools-slurm"
WORKFLOWS = Path(__file__).parent / "workflows"


@pytest.fixture
def server(slurm_cluster: SlurmCluster, tmp_path: Path, workdir: Path) -> Iterator[Server]:
    cfg = write_config(
        tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)], slurm_pools(),
        auth={"mode": "token", "tokens": [{
            "name": "alice", "team": "vision",
            "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]},
        slurm_compat={"default_partition": "a100",
                      "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "slurm"}},
                      "accounts": {"vis": "vision"}, "default_time_limit_s": 600},
    )
    srv = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    yield srv
    # A tool's cancel at its end (Parsl cancels its block) is graceful: the stop signal, the
    # job's grace, then the kill, which this server sends. It stays up until its Slurm jobs
    # have left the queue, so none is left running on the shared cluster.
    try:
        wait_until(lambda: not _still_queued(srv, slurm_cluster), 180,
                   "this server's Slurm jobs to leave the queue")
    finally:
        srv.stop()


def _still_queued(server: Server, slurm: SlurmCluster) -> list[str]:
    items = httpx.get(f"{server.url}/v1/hpc/jobs", timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}).json()["items"]
    ours = {str(i["run"]["backend_id"]) for i in items if (i.get("run") or {}).get("backend_id")}
    return sorted(ours & set(slurm.job_ids()))


@pytest.fixture
def shim_env(server: Server, workdir: Path) -> dict[str, str]:
    """The user's environment on a login node: the shims first on PATH, then this install."""
    shims = workdir / "shims"
    proc = subprocess.run([str(BIN / "isthmus"), "hpc", "shims", str(shims)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return {"PATH": f"{shims}:{BIN}:{os.environ['PATH']}", "HOME": str(workdir),
            "ISTHMUS_URL": server.url, "ISTHMUS_TOKEN": TOKEN, "LANG": "C.UTF-8"}


@pytest.mark.skipif(shutil.which("snakemake", path=str(BIN)) is None,
                    reason="snakemake is a dev extra (pip install -e '.[dev]')")
def test_snakemake_runs_its_gpu_workflow_on_real_slurm(
        server: Server, shim_env: dict[str, str], workdir: Path) -> None:
    work = workdir / "snakemake"
    shutil.copytree(WORKFLOWS / "snakemake", work)
    work.chmod(0o777)
    proc = subprocess.run(
        [str(BIN / "snakemake"), "--executor", "slurm", "--jobs", "2", "--latency-wait", "60",
         "--seconds-between-status-checks", "2", "--slurm-init-seconds-before-status-checks",
         "2", "--slurm-status-command", "sacct", "--slurm-logdir", str(work / "logs")],
        cwd=work, env=shim_env, capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    first, second = (work / "b.txt").read_text().split()
    assert (work / "a.txt").read_text().strip() == first
    # The tool followed the numbers isbatch printed; each rule ran in its own Slurm job, where
    # SLURM_JOB_ID is Slurm's own id (srun finds its allocation by it), which the job's run
    # shows as its backend id (`isthmus attempts`).
    numbers = re.findall(r"SLURM jobid (\d+)", log)
    assert len(set(numbers)) == 2, log[-3000:]
    items = httpx.get(f"{server.url}/v1/hpc/jobs", timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}).json()["items"]
    backend_ids = {str(i["number"]): i["run"]["backend_id"] for i in items}
    assert [backend_ids[n] for n in dict.fromkeys(numbers)] == [first, second]


@pytest.mark.skipif(shutil.which("process_worker_pool.py", path=str(BIN)) is None,
                    reason="parsl is a dev extra (pip install -e '.[dev]')")
def test_parsl_gets_a_python_apps_value_from_a_real_slurm_job(
        server: Server, shim_env: dict[str, str], workdir: Path) -> None:
    run_dir = workdir / "runinfo"
    proc = subprocess.run(
        [sys.executable, str(WORKFLOWS / "parsl" / "run_app.py"), str(run_dir),
         f"export PATH={BIN}:$PATH"],
        cwd=workdir, env=shim_env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "RESULT 42" in proc.stdout
