"""`isthmus hpc ...`: helpers for login nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.cli.common import AsJson, fail
from broker.cli.output import emit_json
from broker.dropins import shims

hpc_app = typer.Typer(no_args_is_help=True, help="HPC login-node helpers.",
                      rich_markup_mode=None)


@hpc_app.command("shims")
def write_shims(
    folder: Annotated[Path, typer.Argument(help="where to write sbatch, squeue, ... (made if "
                                                "missing); put it first on PATH")],
    as_json: AsJson = False,
) -> None:
    """Write sbatch, squeue, scancel, sacct, scontrol, sinfo (the drop-ins of this install)
    and an srun that explains itself into FOLDER."""
    try:
        written = shims.write(folder)
    except (shims.ShimError, OSError) as exc:
        fail(str(exc))
    if as_json:
        emit_json({"written": [str(p) for p in written]})
        return
    for path in written:
        typer.echo(str(path))
