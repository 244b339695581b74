"""`isthmus hpc shims DIR`: Slurm's command names exec'ing this install's drop-ins, arguments
passed as given; srun explains itself. isinfo answers `sinfo -h -o %P` for the tools that ask
it for partitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.dropins import isinfo, shims
from broker.dropins.common import DropInError

BIN = Path(sys.executable).parent


def test_each_shim_execs_its_drop_in_by_absolute_path(tmp_path: Path) -> None:
    written = shims.write(tmp_path / "bin")
    assert sorted(p.name for p in written) == ["sacct", "sbatch", "scancel", "scontrol",
                                               "sinfo", "squeue", "srun"]
    for path in written:
        assert os.access(path, os.X_OK)
    text = (tmp_path / "bin" / "sbatch").read_text()
    assert f"exec {(BIN / 'isbatch').resolve()} \"$@\"" in text


def test_arguments_reach_the_drop_in_as_written(tmp_path: Path) -> None:
    """No shell interpolation: a job name that is shell text stays text."""
    shims.write(tmp_path / "bin")
    evil = "$(touch pwned)`touch pwned2`;x"
    proc = subprocess.run(
        [str(tmp_path / "bin" / "sbatch"), "--parse-only", "--json", "-J", evil,
         "--gres=gpu:1", "--wrap", "echo hi"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sbatch"]["job_name"] == evil
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_srun_off_the_cluster_says_what_to_do(tmp_path: Path) -> None:
    shims.write(tmp_path / "bin")
    proc = subprocess.run([str(tmp_path / "bin" / "srun"), "hostname"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 1 and "sbatch --wrap" in proc.stderr


def test_isinfo_lists_partitions_as_sinfo_does() -> None:
    assert isinfo.lines(["a100", "h100"], "a100", "%P", header=False) == ["a100*", "h100"]
    assert isinfo.lines(["a100"], "a100", "%9P %5a", header=True) == [
        "PARTITION AVAIL", "a100*     up"]
    shapes = {"a100": {"nodes": 6, "gres": "gpu:a100:8"}}
    assert isinfo.lines(["a100", "h100"], None, "%P %D %G", header=True, shapes=shapes) == [
        "PARTITION NODES GRES", "a100 6 gpu:a100:8", "h100 0 (null)"]
    with pytest.raises(DropInError, match="Invalid node format specification: T"):
        isinfo.lines(["a100"], None, "%P %T", header=False)
