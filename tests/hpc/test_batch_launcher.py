"""entrypoint.launcher 'batch' on Slurm: the user's script is the batch step (run once, on the
first node, its own srun starts the ranks), checked by running the rendered batch script with
stand-in srun and scontrol."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.base import SubmitRequest
from backends.slurm.script import RenderSettings, render
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec

USER_SCRIPT = """#!/bin/bash
#SBATCH -N 2
echo "batch $SLURM_JOB_ID $DATA ${RANK:-no-rank}" >> "$OUT/ran"
srun bash -c 'echo "rank $SLURM_PROCID" >> "$OUT/ran"'
"""


def _request(launcher: str) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": "train", "team": "vision", "gang": {"replicas": 2, "gpus_per_replica": 8},
        "flavors": ["a100-80g"], "max_runtime": "10m", "env": {"DATA": "/d"},
        "entrypoint": {"script": USER_SCRIPT, "launcher": launcher},
    })
    placement = Placement(backend="slurm", backend_instance="slurm-local", pool="slurm-a100",
                          flavor="a100-80g", topology_level=None, topology_domain=None, nodes=())
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name="isthmus-01abcdefghjkmnpq-1",
                         snapshot=RunSnapshot.of(spec), placement=placement, env={})


def _run(tmp_path: Path, launcher: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun stands in for two ranks; scontrol answers hostnames and ignores updates.
    (bin_dir / "srun").write_text(
        "#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\n"
        "for r in 0 1; do SLURM_PROCID=$r SLURM_NODEID=$r \"$@\" || exit; done\n")
    (bin_dir / "scontrol").write_text("#!/bin/bash\n[ \"$1\" = show ] && printf 'n1\\nn2\\n'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    settings = RenderSettings(work_dir=str(tmp_path / "jobs"), python=sys.executable)
    script = tmp_path / "batch.sh"
    script.write_text(render(_request(launcher), partition="a100", settings=settings))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path),
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / "ran").read_text().splitlines()


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        ("batch", ["batch 77 /d no-rank", "rank 0", "rank 1"]),
        ("ranks", ["batch 77 /d 0", "rank 0", "rank 1", "batch 77 /d 1", "rank 0", "rank 1"]),
    ],
    ids=["batch-runs-once", "ranks-runs-per-node"],
)
def test_script_runs_as_launched(tmp_path: Path, launcher: str, expected: list[str]) -> None:
    assert _run(tmp_path, launcher) == expected
