"""isbatch: sbatch for Isthmus.

``isbatch --parse-only --json [options] SCRIPT`` needs no server: it prints the normalised
request as one JSON object (member ``sbatch``). Otherwise the request is sent to the broker.
Exit codes and messages follow sbatch: 255 for an unknown option, 1 for a refused value, and
the message names the option.

Its start-up is part of every submission's latency, so it imports the standard library, the
sbatch reader and the mapping only: no httpx, no pydantic (`broker.client`); what only
some requests need (dependencies, arrays) is imported on use.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.client import ApiError, Client, TransportError
from broker.dropins import client_config, pipes
from broker.sbatch import parse as sbatch_parse
from broker.sbatch.compat import CompatError, CompatTables, exported_env, to_job_spec
from broker.sbatch.values import SbatchError

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
            if options.test_only:
                return _test_only(api, parsed, environ)
            body = client_body(parsed.request, parsed.script, parsed.command_line.script_path,
                               exported_env(parsed.request, environ),
                               options.chdir or os.getcwd())
            job = api.batch(body)  # one call: the broker maps, resolves and submits
    except CompatError as exc:
        return _fail(str(exc))
    except ApiError as exc:
        if str(exc.problem.get("type", "")).endswith(":sbatch-not-mapped"):
            return _fail(str(exc))
        if str(exc.problem.get("type", "")).endswith(":concurrency-limit"):
            # as sbatch words a QOS submit limit (MaxSubmitJobs), with the limit named
            return _fail("Batch job submission failed: Job violates accounting/QOS policy "
                         f"(job submit limit): {exc.problem.get('detail', '')}")
        return _fail(f"{exc} (HTTP {exc.status})")
    except TransportError as exc:
        return _fail(f"cannot reach the Isthmus broker at {conf.url}: {exc}")
    # The number, as Slurm's tools parse it (the Isthmus id only from a broker without numbers).
    shown = str(job.get("number") or job["id"])
    if options.json:
        print(json.dumps(job, sort_keys=True))
    elif options.parsable:
        cluster = parsed.request.extra.get("options", {}).get("clusters")
        print(f"{shown};{cluster}" if cluster else shown)
    else:
        print(f"Submitted batch job {shown}")
    return 0


def client_body(request: sbatch_parse.SbatchRequest, script: str, script_path: str | None,
                env: Mapping[str, str], submit_dir: str | None) -> dict[str, Any]:
    """The body of POST /v1/hpc/batch (read by `broker.orchestration.batch_submit.body_of`):
    the request, the script and what only this side knows (the variables --export names, with
    values from the user's environment, and the submit directory)."""
    return {"sbatch": request.sbatch_json(), "extra": request.extra, "script": script,
            "script_path": script_path, "env": dict(env), "submit_dir": submit_dir}


def _resolver(api: Client) -> Callable[[str], list[str]]:
    """Job ids of --dependency as the user writes them (an id, an array id, ARRAY_TASK) ->
    Isthmus job ids among the jobs the user may see (for --test-only; a submission has the
    broker resolve them)."""
    seen: list[Any] = []

    def resolve(ref: str) -> list[str]:
        # Imported on use: they load broker.domain, which would cost every submission ~0.5 s.
        from broker.dropins.common import all_jobs

        if not seen:
            seen.extend(all_jobs(api))
        exact = [v.id for v in seen if ref in (v.id, v.display_id)]
        return exact or [v.id for v in seen if v.array_job_id == ref]

    return resolve


def _test_only(api: Client, parsed: sbatch_parse.Parsed, environ: Mapping[str, str]) -> int:
    """Ask the broker's what-if (POST /v1/plan) where and when the job would start and say it
    as `sbatch --test-only` does (on stderr); nothing is stored. Exit 1 when the broker would
    reject the job."""
    options = parsed.command_line.options
    compat_data = api.slurm_compat()
    spec = to_job_spec(
        parsed.request, parsed.script, CompatTables.from_json(compat_data["slurm_compat"]),
        caller_team=compat_data["caller"].get("team"),
        caller_name=compat_data["caller"].get("name"),
        script_path=parsed.command_line.script_path, environ=environ,
        submit_dir=options.chdir or os.getcwd(), resolve=_resolver(api),
        native_allowed=lambda team: compat_data.get("native_slurm_options", {}).get(team, []),
    )
    plan = api.plan(spec)
    if options.json:
        print(json.dumps({"spec": spec, "plan": plan}, sort_keys=True))
        return 1 if plan["would_reject"] else 0
    for line in plan_lines(spec, plan):
        print(f"{PROG}: {line}", file=sys.stderr)
    return 1 if plan["would_reject"] else 0


def plan_lines(spec: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """sbatch's ``Job N to start at T using K processors on nodes L in partition P``, with the
    job's name for N (nothing is submitted, so there is no id) and the Isthmus pool for P; then
    why it would wait, when it would."""
    name = spec["name"]
    if plan["would_reject"]:
        return [f"error: Job {name} would be rejected ({plan['reason']}): {plan['message']}"]
    lines: list[str] = []
    at = plan.get("estimated_start")
    if at and plan.get("pool"):
        # imported here: broker.domain would cost every submission its start-up
        from broker.domain.hostlist import compress

        gang = spec["gang"]
        cpus = gang["replicas"] * (gang.get("cpus_per_replica") or 1)
        lines.append(f"Job {name} to start at {_local_time(at)} using {cpus} processors on "
                     f"nodes {compress(plan.get('nodes') or [])} in partition {plan['pool']}")
        # imported here: the domain package (pydantic) stays out of a submission's start-up
        from broker.domain.start_window import likely_of

        window = likely_of(plan.get("start_window"))
        if window:
            lines.append(f"Job {name} start {window}")
    elif plan["basis"] == "feasibility":
        lines.append(f"Job {name} would be accepted; no start time: {plan['note']}")
        return lines
    else:
        method = plan.get("estimate_method") or "unknown"
        lines.append(f"Job {name} start time unknown ({method})")
    if not plan["admitted"]:
        ahead = plan.get("queued_ahead")
        behind = f" behind {ahead} queued job(s)" if ahead else ""
        lines.append(f"Job {name} would wait{behind}: {plan['reason']}: {plan['message']}")
    if plan.get("note") and plan["basis"] == "admission":
        lines.append(f"note: {plan['note']}")
    return lines


def _local_time(iso: str) -> str:
    """The broker's UTC time as sbatch prints it: local time, to the second, no zone."""
    from datetime import datetime

    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
