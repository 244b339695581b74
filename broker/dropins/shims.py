"""Slurm's command names for the drop-ins: a folder a site puts first on users' PATH (e.g. with
an environment module), without touching the real Slurm commands.

Each shim is two lines of sh that exec the drop-in of this installation by absolute path with
the arguments exactly as given (``"$@"``: nothing is interpolated). ``srun`` off the cluster has
no job to start steps in: its shim says so and what to run instead.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

DROP_INS = {"sbatch": "isbatch", "squeue": "isqueue", "scancel": "iscancel",
            "sacct": "isacct", "scontrol": "iscontrol", "sinfo": "isinfo"}
SRUN = """#!/bin/sh
# Written by `isthmus hpc shims`.
echo "srun: error: Isthmus runs srun inside a job only: there the batch script's srun starts \
its ranks. On a login node, submit the script with sbatch (Isthmus's isbatch); for a quick \
command, sbatch --wrap='COMMAND' (with --gres for its GPUs)." >&2
exit 1
"""


class ShimError(Exception):
    pass


def drop_in_path(name: str) -> Path:
    """The console script of this installation (beside its Python), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside.resolve()
    found = shutil.which(name)
    if found is None:
        raise ShimError(f"{name} is not installed beside {sys.executable} nor on PATH")
    return Path(found).resolve()


def write(folder: Path) -> list[Path]:
    """Write the shims into `folder` (made if missing); the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for slurm, ours in DROP_INS.items():
        target = shlex.quote(str(drop_in_path(ours)))
        text = (f"#!/bin/sh\n# Written by `isthmus hpc shims`: {slurm} is {ours}.\n"
                f'exec {target} "$@"\n')
        written.append(_put(folder / slurm, text))
    written.append(_put(folder / "srun", SRUN))
    return written


def _put(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
