"""Real workflow tools, installed from PyPI and run unchanged, with `isthmus hpc shims` first on
PATH, against a real server on the simulated federation (issue 28).

The simulation runs no commands, so `tests/harness/sim_node.SimNode` plays the compute node:
it runs each started job's batch script locally, as a rank on Kubernetes would. What is real:
the tool's sbatch command line and its parsing of what sbatch prints, its status polling through
sacct (JobIdRaw|State by --name), the broker's lifecycle and the rule's output files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.server import Server, write_config
from tests.harness.sim_node import SimNode

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TOKEN = "tok-vision-tools"
WORKFLOWS = Path(__file__).parent / "workflows"
SIM = {"emulate": "slurm", "speed": 100, "seed": 1, "start_delay": 1, "progress": False,
       "runtime_fraction": 0.05}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tools")
    cap = {"nodes": 4, "gpus_per_node": 8, "nodes_per_rack": 2, "racks_per_block": 2}
    cfg = write_config(
        tmp / "isthmus.yaml", [{"name": "sim-slurm", "kind": "sim", "settings": SIM}],
        [{"name": "slurm-a100", "backend": "sim-slurm", "partition": "a100",
          "flavor": "a100-80g", "capacity": cap}],
        auth={"mode": "token", "tokens": [{
            "name": "alice", "team": "vision",
            "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]},
        slurm_compat={"default_partition": "a100",
                      "partitions": {"a100": {"flavors": ["a100-80g"]}},
                      "accounts": {"vis": "vision"}, "default_time_limit_s": 600},
    )
    srv = Server(cfg, f"sqlite:///{tmp / 'isthmus.db'}", tmp / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture
def shim_env(server: Server, tmp_path: Path) -> dict[str, str]:
    """The user's environment on a login node: the shims first on PATH, then this install."""
    shims = tmp_path / "shims"
    proc = subprocess.run([str(BIN / "isthmus"), "hpc", "shims", str(shims)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    path = f"{shims}:{BIN}:{os.environ['PATH']}"
    return {"PATH": path, "HOME": str(tmp_path), "ISTHMUS_URL": server.url,
            "ISTHMUS_TOKEN": TOKEN, "LANG": "C.UTF-8"}


@pytest.mark.skipif(shutil.which("snakemake", path=str(BIN)) is None,
                    reason="snakemake is a dev extra (pip install -e '.[dev]')")
def test_snakemake_slurm_executor_runs_a_gpu_workflow_to_its_end(
        server: Server, shim_env: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "work"
    shutil.copytree(WORKFLOWS / "snakemake", work)
    with SimNode(server.url, TOKEN, shim_env) as node:
        proc = subprocess.run(
            [str(BIN / "snakemake"), "--executor", "slurm", "--jobs", "2", "--latency-wait",
             "120", "--seconds-between-status-checks", "1",
             "--slurm-init-seconds-before-status-checks", "1", "--slurm-status-command",
             "sacct", "--slurm-logdir", str(work / "logs")],
            cwd=work, env=shim_env, capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    first, second = (work / "b.txt").read_text().split()
    assert (work / "a.txt").read_text().strip() == first
    # the tool read each id as the number sbatch printed and polled it to COMPLETED
    assert first.isdigit() and second.isdigit() and first != second
    assert f"SLURM jobid {first}" in log and f"SLURM jobid {second}" in log
    assert node.ran == {first: 0, second: 0}


@pytest.mark.skipif(shutil.which("process_worker_pool.py", path=str(BIN)) is None,
                    reason="parsl is a dev extra (pip install -e '.[dev]')")
def test_parsl_slurm_provider_gets_a_python_apps_value(
        server: Server, shim_env: dict[str, str], tmp_path: Path) -> None:
    with SimNode(server.url, TOKEN, shim_env) as node:
        proc = subprocess.run(
            [sys.executable, str(WORKFLOWS / "parsl" / "run_app.py"), str(tmp_path / "runinfo")],
            cwd=tmp_path, env=shim_env, capture_output=True, text=True, timeout=900,
            check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "RESULT 42" in proc.stdout
    (number,) = node.started  # one block, its id the number sbatch printed
    # at its end Parsl cancels its block (scancel), still running on the simulation's clock
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", number, "-o", "JobIDRaw,State"],
                          env=shim_env, capture_output=True, text=True, timeout=60, check=True)
    # sacct's "CANCELLED by UID": alice is no user of this host, so Slurm's NO_VAL
    assert acct.stdout.splitlines() == [f"{number}|CANCELLED by 4294967294"]
    # Parsl cancelled it by the number (its regex takes any id: this is what shows that the id
    # it read from sbatch is the number Slurm's tools would see)
    log = "\n".join(p.read_text() for p in (tmp_path / "runinfo").rglob("parsl.log"))
    assert f"scancel {number}" in log
