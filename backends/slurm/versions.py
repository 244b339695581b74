"""Which Slurm / slurmrestd versions the adapter speaks, and how their output differs.

Only 22.05 (OpenAPI v0.0.38) is tested here, against the real local cluster. The rows for
newer versions record the field-name differences known from the Slurm release notes and the
OpenAPI documents; they are marked untested and refused unless ``allow_untested`` is set, so a
cluster upgrade fails loudly at start-up instead of mis-reading job states.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.base import Unsupported


class UnsupportedSlurmVersion(Unsupported):
    """The cluster runs a Slurm or slurmrestd version this adapter does not speak."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """Field names and quirks of one Slurm release line (CLI JSON and REST share them)."""

    slurm: str  # release line, e.g. "22.05"
    openapi: str  # /slurm/<openapi>/ on slurmrestd
    tested: bool
    job_state_is_list: bool  # squeue --json job_state: "RUNNING" vs ["RUNNING", ...]
    numbers_are_objects: bool  # {"set": true, "infinite": false, "number": 3} vs 3
    db_exit_code_reliable: bool  # sacct --json / slurmdb return_code matches the real exit
    submit_script_inside_job: bool  # REST submit: {"job": {"script"}} vs {"script", "job"}
    submit_env_as_list: bool  # REST submit environment: ["K=V"] vs {"K": "V"}
    gres_key: str  # REST submit key for per-node GPUs: "gres" vs "tres_per_node"
    gres_prefix: str  # value prefix for gres_key: "gpu:" vs "gres/gpu:"
    rest_signal_batch: bool  # REST "signal" accepts the "B:" (batch shell) prefix
    rest_requeue_false_ok: bool  # REST "requeue": false means false (v0.0.38: any value = on)


DIALECTS: dict[str, Dialect] = {
    "22.05": Dialect(
        slurm="22.05", openapi="v0.0.38", tested=True, job_state_is_list=False,
        numbers_are_objects=False, db_exit_code_reliable=False,
        submit_script_inside_job=False, submit_env_as_list=False,
        gres_key="gres", gres_prefix="gpu:", rest_signal_batch=False,
        rest_requeue_false_ok=False,
    ),
    # Untested: written from the 23.02 release notes (v0.0.39 keeps v0.0.38's job fields).
    "23.02": Dialect(
        slurm="23.02", openapi="v0.0.39", tested=False, job_state_is_list=False,
        numbers_are_objects=False, db_exit_code_reliable=False,
        submit_script_inside_job=False, submit_env_as_list=False,
        gres_key="gres", gres_prefix="gpu:", rest_signal_batch=False,
        rest_requeue_false_ok=False,
    ),
    # Untested: 23.11 introduced v0.0.40 (state lists, {"set","infinite","number"} numbers,
    # script inside job, environment as a list, tres_per_node instead of gres).
    "23.11": Dialect(
        slurm="23.11", openapi="v0.0.40", tested=False, job_state_is_list=True,
        numbers_are_objects=True, db_exit_code_reliable=True,
        submit_script_inside_job=True, submit_env_as_list=True,
        gres_key="tres_per_node", gres_prefix="gres/gpu:", rest_signal_batch=True,
        rest_requeue_false_ok=True,
    ),
    "24.05": Dialect(
        slurm="24.05", openapi="v0.0.41", tested=False, job_state_is_list=True,
        numbers_are_objects=True, db_exit_code_reliable=True,
        submit_script_inside_job=True, submit_env_as_list=True,
        gres_key="tres_per_node", gres_prefix="gres/gpu:", rest_signal_batch=True,
        rest_requeue_false_ok=True,
    ),
    # Untested: Debian 13. slurmrestd serves v0.0.40-v0.0.42 (openapi/slurmctld plugin).
    "24.11": Dialect(
        slurm="24.11", openapi="v0.0.42", tested=False, job_state_is_list=True,
        numbers_are_objects=True, db_exit_code_reliable=True,
        submit_script_inside_job=True, submit_env_as_list=True,
        gres_key="tres_per_node", gres_prefix="gres/gpu:", rest_signal_batch=True,
        rest_requeue_false_ok=True,
    ),
}

VERSION_TABLE = """\
field                      22.05 / v0.0.38 (tested)     23.11+ / v0.0.40+ (UNTESTED)
squeue --json job_state    "PENDING"                    ["PENDING"] (base state + flags)
numbers (time_limit, ...)  3 / null                     {"set", "infinite", "number"}
squeue exit_code           wait status (768 = exit 3)   {"status", "return_code", "signal"}
sacct --json return_code   int, WRONG (always 0)        {"set", "infinite", "number"}, right
REST submit body           {"script", "job": {...}}     {"job": {"script", ...}}
REST submit environment    {"K": "V"}                   ["K=V"]
REST submit GPUs           "gres": "gpu:h100:8"         "tres_per_node": "gres/gpu:h100:8"
REST submit nodes          2 (int; [2,2] gave 1 node)               "2" (string)
REST #SBATCH in script     ignored (fields only)        ignored (fields only)
REST signal "B:USR1@120"   refused ("USR1@120" works:   accepted (per the v0.0.40 schema)
                           ranks get it, not the shell)
REST "requeue": false      turns requeue ON (presence   false (per the v0.0.40 schema)
                           is read as true): omitted;
                           the script clears Requeue
sinfo --json node state    "idle" + state_flags         ["IDLE", "DRAIN"]
REST paths                 /slurm/v0.0.38/...           /slurm/v0.0.40 .. v0.0.42/...
"""

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_release(text: str) -> tuple[int, int, int]:
    """'slurm-wlm 22.05.8' / 'slurm 24.11.1' / '22.05.8' -> (22, 5, 8)."""
    m = _RELEASE.search(text)
    if not m:
        raise UnsupportedSlurmVersion(f"cannot read a Slurm version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def dialect_for(release: tuple[int, int, int], *, allow_untested: bool = False) -> Dialect:
    """The dialect of a Slurm release; refuses versions that are unknown or untested."""
    key = f"{release[0]:02d}.{release[1]:02d}"
    dialect = DIALECTS.get(key)
    known = ", ".join(f"{d.slurm}{'' if d.tested else ' (untested)'}" for d in DIALECTS.values())
    version = ".".join(str(p) for p in release)
    if dialect is None:
        raise UnsupportedSlurmVersion(
            f"Slurm {version} is not supported by the Isthmus Slurm backend (known: {known})"
        )
    if not dialect.tested and not allow_untested:
        raise UnsupportedSlurmVersion(
            f"Slurm {version} is only described, not tested, in backends/slurm/versions.py; "
            "set backend setting 'allow_untested_version: true' to try it"
        )
    return dialect


def dialect_for_openapi(version: str, *, allow_untested: bool = False) -> Dialect:
    """The dialect whose slurmrestd path version is ``version`` (e.g. 'v0.0.38')."""
    for dialect in DIALECTS.values():
        if dialect.openapi == version:
            if not dialect.tested and not allow_untested:
                raise UnsupportedSlurmVersion(
                    f"slurmrestd OpenAPI {version} is only described, not tested; set backend "
                    "setting 'allow_untested_version: true' to try it"
                )
            return dialect
    raise UnsupportedSlurmVersion(
        f"slurmrestd OpenAPI {version} is not supported (known: "
        + ", ".join(d.openapi for d in DIALECTS.values())
        + ")"
    )
