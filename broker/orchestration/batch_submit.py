"""isbatch's one call (``POST /v1/hpc/batch``), the server's side: from the request isbatch
parsed to the JobSpecs to submit.

isbatch reads the script and the options itself (sbatch's errors and exit codes are its own)
and sends the normalised request; here it is mapped through this broker's ``slurm_compat``
section (`compat.to_job_spec`), its ``--dependency`` ids resolved among the jobs the caller may
see, and an array split into its tasks. The route then checks and submits every spec exactly
as ``POST /v1/jobs`` does. Nothing here trusts the body: unknown members are refused, every
value is checked again by `to_job_spec` and the JobSpec model.

An option Isthmus does not translate passes to Slurm when the job's team's policy here allows
it (`native_allowed`): the server decides, isbatch does not know the policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from broker.config import IsthmusConfig
from broker.domain.spec import JobSpec
from broker.sbatch.compat import CompatError, NativeAllowed, array_specs, to_job_spec
from broker.sbatch.parse import SbatchRequest
from broker.store.db import Database
from broker.store.queries import list_jobs

MAX_DEPENDENCY_SCAN = 10_000
"""Jobs of the caller's team read to resolve --dependency ids (newest first), as isbatch did."""
_REQUEST_FIELDS = {f.name for f in fields(SbatchRequest)}
_KINDS: dict[str, type] = {"replicas": int, "gpus_per_node": int, "time_limit_s": int,
                           "cpus_per_task": int, "mem_mb": int, "exclusive": bool}
_BODY = {"sbatch", "extra", "script", "script_path", "env", "submit_dir"}
ARRAY_PLACEHOLDER = "0"
"""The array id the tasks are mapped with; `numbered_array` puts the array's number in."""


@dataclass(frozen=True)
class BatchBody:
    request: SbatchRequest
    script: str
    script_path: str | None
    env: dict[str, str]
    submit_dir: str | None


def body_of(data: Any) -> BatchBody:
    """The body as isbatch sends it (`isbatch.client_body`), or CompatError saying what is wrong."""
    if not isinstance(data, dict) or set(data) - _BODY or not {"sbatch", "script"} <= set(data):
        raise CompatError(f"the body must be an object with {sorted(_BODY)} (sbatch, script "
                          "required)")
    sbatch, extra = data["sbatch"], data.get("extra") or {}
    if not isinstance(sbatch, dict) or set(sbatch) != _REQUEST_FIELDS - {"extra"}:
        raise CompatError("sbatch: the normalised request of isbatch --parse-only --json")
    if not isinstance(extra, dict) or not isinstance(extra.get("options", {}), dict):
        raise CompatError("extra: an object (its 'options' an object)")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise CompatError("env: an object of strings")
    script, path, cwd = data["script"], data.get("script_path"), data.get("submit_dir")
    if not isinstance(script, str) or not all(x is None or isinstance(x, str)
                                              for x in (path, cwd)):
        raise CompatError("script, script_path, submit_dir: strings")
    for key, value in sbatch.items():
        kind = _KINDS.get(key, str)
        if value is not None and (type(value) is not kind):
            raise CompatError(f"sbatch.{key}: {kind.__name__} or null")
    if not isinstance(sbatch["exclusive"], bool):
        raise CompatError("sbatch.exclusive: a boolean")
    return BatchBody(SbatchRequest(**sbatch, extra=extra), script, path, dict(env), cwd)


def native_allowed(config: IsthmusConfig) -> NativeAllowed:
    """A team's name -> the sbatch options its policy (`teams[].native.slurm.options`) lets
    pass; nothing for a team without one (or unknown: the spec's checks name it)."""

    def allowed(team: str) -> list[str]:
        found = config.team(team)
        return list(found.native.slurm.options) if found and found.native else []

    return allowed


def specs_of_body(data: Any, compat: Any, caller_team: str | None,
                  resolve: Callable[[str], list[str]], array_id: str,
                  caller_name: str | None = None,
                  native: NativeAllowed | None = None) -> list[dict[str, Any]]:
    """`specs_of` for a body as received; CompatError for anything malformed (a value of the
    wrong type deep in ``extra`` too: isbatch never sends one)."""
    body = body_of(data)
    try:
        return specs_of(body, compat, caller_team, resolve, array_id, caller_name, native)
    except (AttributeError, KeyError, TypeError) as exc:
        raise CompatError(f"malformed sbatch request: {exc}") from None


def numbered_array(specs: list[JobSpec], numbers: list[int]) -> list[JobSpec]:
    """An array's task specs with the array's id made its first task's number (Slurm's
    ArrayJobId), in scheduling.array.id and SLURM_ARRAY_JOB_ID."""
    array_id = str(numbers[0])
    out = []
    for spec in specs:
        assert spec.scheduling is not None and spec.scheduling.array is not None
        scheduling = spec.scheduling.model_copy(
            update={"array": spec.scheduling.array.model_copy(update={"id": array_id})})
        env = {**spec.env, "SLURM_ARRAY_JOB_ID": array_id}
        out.append(spec.model_copy(update={"scheduling": scheduling, "env": env}))
    return out


def resolver(db: Database, team: str | None) -> Callable[[str], list[str]]:
    """--dependency ids as the user writes them (a number, an Isthmus id, an array id,
    ARRAY_TASK) -> ids of jobs of `team` (every team's for None: an admin)."""
    seen: list[tuple[str, set[str], str | None]] = []

    def resolve(ref: str) -> list[str]:
        if not seen:
            with db.read() as s:
                for job in list_jobs(s, team=team, limit=MAX_DEPENDENCY_SCAN):
                    array = (json.loads(job.spec_json).get("scheduling") or {}).get("array")
                    array = array or {}
                    array_id = (str(job.array_number) if job.array_number is not None
                                else array.get("id"))
                    own = {job.id} | ({str(job.number)} if job.number is not None else set())
                    if array_id is not None:
                        own.add(f"{array_id}_{array.get('index')}")
                    seen.append((job.id, own, array_id))
        exact = [j for j, own, _ in seen if ref in own]
        whole = [j for j, _, a in seen if a == ref]
        return whole or exact  # an array's id is also its first task's number: all tasks

    return resolve


def specs_of(body: BatchBody, compat: Any, caller_team: str | None,
             resolve: Callable[[str], list[str]], array_id: str,
             caller_name: str | None = None,
             native: NativeAllowed | None = None) -> list[dict[str, Any]]:
    """The specs to submit: one, or one per array task (CompatError when it cannot map)."""
    spec = to_job_spec(body.request, body.script, compat, caller_team=caller_team,
                       caller_name=caller_name,
                       script_path=body.script_path, environ=body.env,
                       submit_dir=body.submit_dir, resolve=resolve, native_allowed=native)
    return array_specs(spec, body.request, array_id) if body.request.array else [spec]
