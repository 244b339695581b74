"""isbatch: sbatch for Isthmus.

``isbatch --parse-only --json [options] SCRIPT`` needs no server: it prints the normalised
request as one JSON object (member ``sbatch``). Otherwise the request is sent to the broker.
Exit codes and messages follow sbatch: 255 for an unknown option, 1 for a refused value, and
the message names the option.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from broker.client import ApiError, Client
from broker.hpc import client_config, sbatch_parse
from broker.hpc.compat import CompatError, array_specs, to_job_spec
from broker.hpc.compat_config import SlurmCompat
from broker.hpc.sbatch_values import SbatchError

PROG = "isbatch"
USAGE = (
    "Usage: isbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n"
    "isbatch takes sbatch's options (see sbatch(1)); its own: --parse-only, --json.\n"
)


def _read_script(path: str | None) -> str:
    if path is None:
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SbatchError(f"Unable to open file {path}: {exc.strerror}") from exc


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    try:
        parsed = sbatch_parse.parse(argv, environ, _read_script)
    except SbatchError as exc:
        text = str(exc)
        if exc.exit_code == 255 and text.startswith("unrecognized option"):
            print(f"{PROG}: {text}\nTry \"{PROG} --help\" for more information", file=sys.stderr)
        else:
            print(f"{PROG}: error: {text}", file=sys.stderr)
        return exc.exit_code
    options = parsed.command_line.options
    if options.help:
        sys.stdout.write(USAGE)
        return 0
    if options.parse_only:
        out = {"sbatch": parsed.request.sbatch_json(), "extra": parsed.request.extra,
               "script_args": list(parsed.script_args)}
        if options.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        else:
            for key, value in parsed.request.sbatch_json().items():
                print(f"{key}={'' if value is None else value}")
        return 0
    return submit(parsed, environ)


def _fail(text: str, code: int = 1) -> int:
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return code


def submit(parsed: sbatch_parse.Parsed, environ: Mapping[str, str]) -> int:
    """Map the request with the broker's slurm_compat section and submit it as the user."""
    options = parsed.command_line.options
    if parsed.script_args:
        return _fail("script arguments are not supported by Isthmus yet: "
                     f"{' '.join(parsed.script_args)}")
    try:
        conf = client_config.load(environ)
    except client_config.ClientConfigError as exc:
        return _fail(str(exc))
    try:
        with Client(conf.url, conf.token) as api:
            compat_data = api.slurm_compat()
            compat = SlurmCompat.model_validate(compat_data["slurm_compat"])
            spec = to_job_spec(
                parsed.request, parsed.script, compat,
                caller_team=compat_data["caller"].get("team"),
                script_path=parsed.command_line.script_path,
                environ=environ, submit_dir=options.chdir or os.getcwd(),
                resolve=_resolver(api),
            )
            if options.test_only:
                return _test_only(spec, options.json)
            if parsed.request.array:
                from broker.domain.ids import new_job_id  # here: the package import is slow

                array_id = new_job_id()
                tasks = array_specs(spec, parsed.request, array_id)
                jobs = [api.submit(t, idempotency_key=f"isbatch-{array_id}-{i}")
                        for i, t in enumerate(tasks)]
                job = {"id": array_id, "array_tasks": [j["id"] for j in jobs]}
            else:
                job = api.submit(spec)
    except CompatError as exc:
        return _fail(str(exc))
    except ApiError as exc:
        return _fail(f"{exc} (HTTP {exc.status})")
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach the Isthmus broker at {conf.url}: {exc}")
    if options.json:
        print(json.dumps(job, sort_keys=True))
    elif options.parsable:
        print(job["id"])
    else:
        print(f"Submitted batch job {job['id']}")
    return 0


def _resolver(api: Client) -> Callable[[str], list[str]]:
    """Job ids of --dependency as the user writes them (an id, an array id, ARRAY_TASK) ->
    Isthmus job ids among the jobs the user may see."""
    seen: list[Any] = []

    def resolve(ref: str) -> list[str]:
        # Imported on use: they load broker.domain, which would cost every submission ~0.5 s.
        from broker.hpc.common import all_jobs

        if not seen:
            seen.extend(all_jobs(api))
        exact = [v.id for v in seen if ref in (v.id, v.display_id)]
        return exact or [v.id for v in seen if v.array_job_id == ref]

    return resolve


def _test_only(spec: dict[str, Any], as_json: bool) -> int:
    """What would be submitted (no what-if endpoint yet: placement and start time are not
    estimated)."""
    if as_json:
        print(json.dumps({"spec": spec}, sort_keys=True))
        return 0
    gang = spec["gang"]
    print(f"{PROG}: Job {spec['name']} would be submitted for team {spec['team']}: "
          f"{gang['replicas']} node(s) x {gang['gpus_per_replica']} GPU(s) of "
          f"{', '.join(spec['flavors'])} (backend {spec['backend']}); nothing was submitted",
          file=sys.stderr)
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))
