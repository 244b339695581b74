"""From a normalised sbatch request to a JobSpec, through the ``slurm_compat:`` section. Pure.

How each option lands (the README's HPC section says the same):

| sbatch | JobSpec |
|---|---|
| -p/--partition (comma list) | flavors of the mapped partitions, in order; backend slurm/k8s/any |
| --gres/--gpus*/-G type | narrows the flavors to the mapped flavor of that GPU type |
| -C/--constraint (features joined by &) | narrows the flavors to each feature's mapped flavor |
| -A/--account (default: the token's team) | team, or team and queue (`accounts: {A: team/queue}`) |
| -q/--qos | priority class |
| -N, -n, --ntasks-per-node, --ntasks-per-gpu | gang.replicas, one_per_node, tasks_per_replica |
| GPUs per node, cpus, memory | gang.gpus_per_replica, cpus_per_replica, memory_per_replica |
| -t/--time | max_runtime (slurm_compat.default_time_limit_s when absent) |
| --signal=[{R|B}:]SIG[@S] | checkpoint.grace = S, .signal = SIG, .signal_batch_only = B: |
| -J/--job-name | name (lowercased, other characters become '-') |
| the script | entrypoint.script with launcher 'batch' |
| -o/--output, -e/--error (relative to the submit directory) | entrypoint.batch.output/error |
| --exclusive | entrypoint.batch.exclusive; Slurm partitions only (backend narrowed to slurm) |
| --export=VAR=value,VAR | env |
| --mail-user=ADDR, --mail-type=TYPES | notify.emails, notify.events (notices.MAIL_TYPES) |

Kept as the pod annotation ``sbatch.isthmus.io/request`` and otherwise without effect
(``STORED``): chdir, comment, requeue, hints, nice, GPU binding, verbosity. Every other
option is refused by name, as are partitions, accounts, qos, GPU types and features the section
does not map.

An option none of these translate that the job's team may pass to Slurm natively
(``teams[].native.slurm.options``, given through ``native_allowed``: the server decides) goes
into ``native.slurm.options`` as written, stored ones (``--nice``) included, and narrows the job
to Slurm (``backend: slurm``), where sbatch reads it: an option that would be refused is then
refused on a Kubernetes partition, and a stored one stays without effect there.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from broker.sbatch.parse import SbatchRequest
from broker.sbatch.values import parse_array, parse_begin, parse_dependency, parse_signal

if TYPE_CHECKING:  # the pydantic model is the server's; isbatch reads the served JSON
    from broker.config_slurm_compat import SlurmCompat

# Given options with no effect on the job; kept in the request annotation.
STORED = frozenset({
    "chdir", "comment", "open_mode",
    "requeue", "no_requeue", "hint", "distribution", "verbose", "quiet", "parsable", "export",
    "get_user_env", "propagate", "kill_on_invalid_dep", "wckey", "acctg_freq", "profile",
    "clusters",  # one federation: -M is kept and shown (--parsable prints ID;CLUSTER)
    "nice",  # the broker orders a team's jobs by priority class and submit time
    "gpu_bind", "gres_flags",  # GPU binding: Isthmus binds a task's GPUs (--gpus-per-task)
})
# Given options that the mapping reads.
MAPPED = frozenset({
    "partition", "account", "qos", "gres", "gpus", "gpus_per_node", "gpus_per_task", "nodes",
    "ntasks", "ntasks_per_node", "cpus_per_task", "cpus_per_gpu", "mem", "mem_per_gpu",
    "mem_per_cpu", "time", "job_name", "constraint", "signal", "wrap", "test_only", "output",
    "error", "exclusive", "mail_type", "mail_user", "ntasks_per_gpu",
    "hold",  # read by the batch route: the jobs are held once stored (scontrol release)
})
_BATCH_PATH = re.compile(r"^[A-Za-z0-9._/%+@=,~-]+$")  # the spec's BATCH_PATH, relative allowed
# Become spec.scheduling (holds before admission) and, for arrays, one job per task.
SCHEDULING = frozenset({"array", "dependency", "begin"})
NEVER_EXPORTED = frozenset({"ISTHMUS_TOKEN", "ISTHMUS_URL"})
NATIVE_POLICY_KEY = "isthmus.yaml teams[].native.slurm.options"
NativeAllowed = Callable[[str], Collection[str]]
"""A team's name -> the sbatch options its policy lets pass to Slurm (``--reservation``)."""
ANNOTATION = "sbatch.isthmus.io/request"
_NAME_BAD = re.compile(r"[^a-z0-9-]+")


class CompatError(Exception):
    """The request cannot be expressed here; the message names the option and what is mapped."""


@dataclass(frozen=True)
class Partition:
    flavors: tuple[str, ...]
    backend: str


@dataclass(frozen=True)
class CompatTables:
    """The ``slurm_compat`` section as `GET /v1/hpc/slurm-compat` serves it (the server has
    validated it as `SlurmCompat`), without pydantic: isbatch must start fast."""

    default_partition: str | None
    partitions: Mapping[str, Partition]
    accounts: Mapping[str, str]
    default_accounts: Mapping[str, str]
    qos: Mapping[str, str]
    gpu_types: Mapping[str, str]
    constraints: Mapping[str, str]
    image: str | None
    default_time_limit_s: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompatTables:
        try:
            return cls(
                default_partition=data.get("default_partition"),
                partitions={k: Partition(tuple(v["flavors"]), v.get("backend", "any"))
                            for k, v in (data.get("partitions") or {}).items()},
                accounts=dict(data.get("accounts") or {}), qos=dict(data.get("qos") or {}),
                default_accounts=dict(data.get("default_accounts") or {}),
                gpu_types=dict(data.get("gpu_types") or {}),
                constraints=dict(data.get("constraints") or {}), image=data.get("image"),
                default_time_limit_s=int(data.get("default_time_limit_s") or 3600),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CompatError(f"the broker's slurm_compat section is not readable: {exc}") from exc



def _known(table: Mapping[str, Any]) -> str:
    return ", ".join(sorted(table)) or "none"


def job_name(name: str | None, script_path: str | None) -> str:
    raw = name or (script_path.rsplit("/", 1)[-1] if script_path else "wrap")
    text = _NAME_BAD.sub("-", raw.lower()).strip("-")[:63].strip("-")
    return text or "sbatch"


def _flavors(req: SbatchRequest, compat: SlurmCompat | CompatTables) -> tuple[list[str], str, str]:
    partition = req.partition or compat.default_partition
    if partition is None:
        raise CompatError(
            "no partition given (-p) and slurm_compat.default_partition is not set; "
            f"partitions: {_known(compat.partitions)}"
        )
    flavors: list[str] = []
    backends: set[str] = set()
    for name in partition.split(","):
        mapped = compat.partitions.get(name)
        if mapped is None:
            raise CompatError(f"invalid partition specified: {name} (partitions: "
                              f"{_known(compat.partitions)})")
        flavors += [f for f in mapped.flavors if f not in flavors]
        backends.add(mapped.backend)
    backend = backends.pop() if len(backends) == 1 else "any"
    if req.gpu_type is not None:
        flavor = compat.gpu_types.get(req.gpu_type)
        if flavor is None:
            raise CompatError(f"GPU type '{req.gpu_type}' is not mapped (--gres/--gpus); "
                              f"GPU types: {_known(compat.gpu_types)}")
        if flavor not in flavors:
            raise CompatError(f"GPU type '{req.gpu_type}' ({flavor}) is not offered in "
                              f"partition {partition}")
        flavors = [flavor]
    if req.constraint is not None:
        for feature in req.constraint.split("&"):
            flavor = compat.constraints.get(feature)
            if flavor is None:
                raise CompatError(
                    f"--constraint={req.constraint}: feature '{feature}' is not mapped (only "
                    f"features joined by '&'); features: {_known(compat.constraints)}"
                )
            if flavor not in flavors:
                raise CompatError(f"--constraint={req.constraint}: no node of partition "
                                  f"{partition} has feature '{feature}'")
            flavors = [flavor]
    return flavors, backend, partition


def exported_env(req: SbatchRequest, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables --export gives the job (values from `environ` where none is written)."""
    return _env(req, environ)


def _env(req: SbatchRequest, environ: Mapping[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    export = req.extra.get("export")
    for item in (export or "").split(","):
        key, eq, value = item.partition("=")
        if not key or key in ("ALL", "NONE", "NIL") or key in NEVER_EXPORTED:
            continue
        if eq:
            env[key] = value
        elif key in environ:
            env[key] = environ[key]
    return env


def _scheduling(req: SbatchRequest, resolve: Callable[[str], list[str]] | None,
                now: datetime) -> dict[str, Any]:
    out: dict[str, Any] = {}
    begin = req.extra.get("begin")
    if begin:
        out["begin_at"] = parse_begin(begin, now).isoformat()
    if req.dependency:
        deps = parse_dependency(req.dependency)
        items = []
        for d in deps.items:
            if d.kind not in ("after", "afterany", "afterok", "afternotok", "singleton"):
                raise CompatError(f"--dependency={req.dependency}: '{d.kind}' is not supported "
                                  "(after, afterany, afterok, afternotok, singleton are)")
            jobs: list[str] = []
            for ref in d.job_ids:
                found = resolve(ref) if resolve is not None else [ref]
                if not found:
                    raise CompatError(f"Job dependency problem: job {ref} is not known "
                                      "(--dependency)")
                jobs += found
            items.append({"kind": d.kind, "jobs": jobs})
        out["dependencies"] = items
        out["any_dependency"] = deps.any_of
    return out


def array_specs(spec: dict[str, Any], req: SbatchRequest, array_id: str) -> list[dict[str, Any]]:
    """One spec per array task: scheduling.array and the SLURM_ARRAY_* variables set."""
    if not req.array:
        return [spec]
    array = parse_array(req.array)
    indices = array.indices
    steps = sorted({b - a for a, b in itertools.pairwise(indices)})
    out = []
    for index in indices:
        env = {**spec.get("env", {}), "SLURM_ARRAY_JOB_ID": array_id,
               "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
               "SLURM_ARRAY_TASK_MIN": str(indices[0]), "SLURM_ARRAY_TASK_MAX": str(indices[-1])}
        if len(steps) <= 1:  # a regular range has a step
            env["SLURM_ARRAY_TASK_STEP"] = str(steps[0] if steps else 1)
        member = {"id": array_id, "index": index, "count": len(indices), "limit": array.limit}
        scheduling = {**spec.get("scheduling", {}), "array": member}
        out.append({**spec, "env": env, "scheduling": scheduling})
    return out


def _team(req: SbatchRequest, compat: SlurmCompat | CompatTables,
          caller_team: str | None, caller_name: str | None = None) -> tuple[str, str | None]:
    """The team and queue: the -A account's (an account maps to `team` or `team/queue`, as
    Slurm's sub-accounts), else the caller's own team, else the caller's default account's
    (slurm_compat.default_accounts, as Slurm's DefaultAccount). No queue: the job's default."""
    account = req.account
    if account is None and caller_team is not None:
        return caller_team, None
    if account is None and caller_name is not None:
        account = compat.default_accounts.get(caller_name)
    if account is not None:
        target = compat.accounts.get(account)
        if target is None:
            raise CompatError(f"Invalid account or account/partition combination specified: "
                              f"{account} (accounts: {_known(compat.accounts)})")
        team, _, queue = target.partition("/")
        return team, queue or None
    raise CompatError(f"give -A/--account (or set SBATCH_ACCOUNT): your token has no team and "
                      f"slurm_compat.default_accounts names no account for user "
                      f"{caller_name or '(unknown)'} (accounts: {_known(compat.accounts)})")


def _gang(req: SbatchRequest) -> dict[str, Any]:
    """The gang: one replica per node (sbatch's -N asks for nodes: never two on one node) with
    the node's GPUs, CPUs and memory, running --ntasks-per-node tasks that share them."""
    if not req.gpus_per_node:
        raise CompatError("no GPUs requested: Isthmus runs GPU gangs; give --gres=gpu[:type]:N, "
                          "--gpus-per-node, --gpus-per-task or --gpus")
    replicas = req.replicas or 1
    tasks = _tasks_per_node(req)
    ntasks = req.extra.get("ntasks")
    if ntasks is not None and ntasks != replicas * tasks:
        raise CompatError(f"--ntasks={ntasks} over {replicas} node(s) leaves them unequal; "
                          "Isthmus runs gangs of equal ranks: give --ntasks-per-node (or an "
                          "--ntasks that the nodes divide)")
    gang: dict[str, Any] = {"replicas": replicas, "gpus_per_replica": req.gpus_per_node,
                            "one_per_node": True}
    if tasks > 1:
        gang["tasks_per_replica"] = tasks
    if req.cpus_per_task:
        gang["cpus_per_replica"] = req.cpus_per_task * tasks
    elif req.extra.get("cpus_per_gpu"):
        gang["cpus_per_replica"] = req.extra["cpus_per_gpu"] * req.gpus_per_node
    if req.mem_mb:
        gang["memory_per_replica"] = req.mem_mb * 2**20
    return gang


def _tasks_per_node(req: SbatchRequest) -> int:
    """--ntasks-per-node, or --ntasks-per-gpu times the node's GPUs (sbatch starts that many
    tasks for each GPU); both given must agree."""
    tasks: int = req.extra.get("ntasks_per_node") or 1
    per_gpu = req.extra.get("options", {}).get("ntasks_per_gpu")
    if per_gpu is None:
        return tasks
    if not str(per_gpu).isdigit() or not 1 <= int(per_gpu) <= 1024:
        raise CompatError(f"--ntasks-per-gpu={per_gpu}: give a whole number of tasks, 1-1024")
    derived = int(per_gpu) * (req.gpus_per_node or 1)
    if req.extra.get("ntasks_per_node") and req.extra["ntasks_per_node"] != derived:
        raise CompatError(f"--ntasks-per-gpu={per_gpu} with {req.gpus_per_node} GPUs a node "
                          f"is {derived} tasks a node, not --ntasks-per-node="
                          f"{req.extra['ntasks_per_node']}: give one of the two")
    return derived


def _batch_options(req: SbatchRequest, submit_dir: str | None) -> dict[str, Any]:
    """--output/--error as absolute patterns (relative ones are relative to the submit
    directory, as with sbatch) and --exclusive, for entrypoint.batch."""
    out: dict[str, Any] = {}
    for key in ("output", "error"):
        pattern = req.extra.get(key)
        if not pattern:
            continue
        if not _BATCH_PATH.match(pattern):
            raise CompatError(f"--{key}={pattern}: use a path of letters, digits and "
                              "._/%+@=,~- (no spaces)")
        if not pattern.startswith("/"):
            if not submit_dir or not submit_dir.startswith("/"):
                raise CompatError(f"--{key}={pattern}: a relative path needs the submit "
                                  "directory (--chdir)")
            pattern = submit_dir.rstrip("/") + "/" + pattern
            if not _BATCH_PATH.match(pattern):
                raise CompatError(f"--{key}: the submit directory {submit_dir} is not a path "
                                  "of letters, digits and ._/%+@=,~- (use an absolute path)")
        out[key] = pattern
    if req.exclusive:
        out["exclusive"] = True
    return out


def _entrypoint(req: SbatchRequest, script: str, compat: SlurmCompat | CompatTables,
                submit_dir: str | None) -> dict[str, Any]:
    entrypoint: dict[str, Any] = {"script": script, "launcher": "batch"}
    if compat.image:
        entrypoint["image"] = compat.image
    batch = _batch_options(req, submit_dir)
    if batch:
        entrypoint["batch"] = batch
    return entrypoint


def _notify(req: SbatchRequest) -> dict[str, Any] | None:
    """--mail-user and --mail-type as the job's own notices (mail only: addresses, no
    webhooks). As in Slurm, nothing is sent without both, and NONE sends nothing."""
    user, types = req.extra.get("mail_user"), req.extra.get("mail_type")
    if not user or not types:
        return None
    # Here, not at the top: isbatch imports this module and starts without pydantic or the
    # domain package (tests/hpc/test_isbatch_startup.py); the mapping runs in the broker.
    from broker.domain.notices import MAX_JOB_TARGETS, JobNotify, kinds_of_mail_type

    try:
        kinds = kinds_of_mail_type(str(types))
    except ValueError as exc:
        raise CompatError(str(exc)) from None
    if not kinds:
        return None
    emails = [a.strip() for a in str(user).split(",") if a.strip()]
    try:
        JobNotify(emails=emails)
    except ValueError:
        raise CompatError(f"--mail-user: '{str(user)[:80]}' is not a mail address (at most "
                          f"{MAX_JOB_TARGETS}, comma-separated: name@example.org)") from None
    return {"emails": emails, "events": sorted(kinds)}


def _refuse_untranslated(options: Mapping[str, Any]) -> None:
    """CompatError naming the given options Isthmus neither maps nor keeps, nor lets any team
    pass to Slurm (those wait for the team's policy: `_native_slurm`)."""
    unsupported = sorted(set(options) - STORED - MAPPED - SCHEDULING - _passable())
    if unsupported:
        names = ", ".join(f"--{o.replace('_', '-')}" for o in unsupported)
        raise CompatError(f"{names}: not supported by Isthmus (nothing was submitted)")


def _passable() -> frozenset[str]:
    """The options a team may ever pass to Slurm, in the request's spelling (``delay_boot``)."""
    # Here, not at the top: the domain package (pydantic) stays out of isbatch's start-up.
    from broker.domain.native import SLURM_OPTIONS

    return frozenset(o.replace("-", "_") for o in SLURM_OPTIONS)


def _native_slurm(given: Mapping[str, Any], team: str, backend: str, partition: str,
                  native_allowed: NativeAllowed | None) -> list[str]:
    """The given options Isthmus does not translate that `team` may pass to Slurm, as
    ``--name=value`` data (never a shell word); CompatError for one it may not pass, naming the
    option and the key that would allow it, or for any of them on a Kubernetes partition."""
    from broker.domain.native import NativeProblem, slurm_option

    allowed = set(native_allowed(team)) if native_allowed is not None else set()
    out: list[str] = []
    refused: list[str] = []
    for key in sorted(set(given) & _passable() - MAPPED - SCHEDULING):
        name, value = key.replace("_", "-"), given[key]
        stored = key in STORED
        if f"--{name}" not in allowed or (stored and backend == "k8s"):
            if not stored:  # a stored one stays kept without effect, as without a policy
                refused.append(f"--{name}")
            continue
        if value is True or value == "":
            text = f"--{name}"
        elif isinstance(value, str):
            text = f"--{name}={value}"
        else:
            raise CompatError(f"--{name}: a text value is expected")
        try:
            slurm_option(text)
        except NativeProblem as exc:
            raise CompatError(f"--{name}={str(value)[:60]}: cannot pass to Slurm: "
                              f"{exc.message}") from None
        out.append(text)
    if refused:
        it = "it" if len(refused) == 1 else "them"
        raise CompatError(
            f"{', '.join(refused)}: not supported by Isthmus, and team {team} may not pass "
            f"{it} to Slurm natively (nothing was submitted); an admin may allow {it} in "
            f"{NATIVE_POLICY_KEY} "
            f"(allowed now: {', '.join(sorted(allowed)) or 'nothing'})")
    if out and backend == "k8s":
        raise CompatError(f"{', '.join(o.split('=', 1)[0] for o in out)}: partition {partition} "
                          "runs on Kubernetes, where sbatch options do not reach; use a Slurm "
                          "partition")
    return out


def _slurm_only(backend: str, partition: str) -> str:
    """--exclusive reserves whole nodes, which Slurm does and Kubernetes pools do not."""
    if backend == "k8s":
        raise CompatError(f"--exclusive: partition {partition} runs on Kubernetes, where "
                          "Isthmus does not reserve whole nodes; use a Slurm partition")
    return "slurm"


def to_job_spec(
    req: SbatchRequest,
    script: str,
    compat: SlurmCompat | CompatTables,
    *,
    caller_team: str | None,
    caller_name: str | None = None,
    script_path: str | None = None,
    environ: Mapping[str, str] | None = None,
    submit_dir: str | None = None,
    resolve: Callable[[str], list[str]] | None = None,
    now: datetime | None = None,
    native_allowed: NativeAllowed | None = None,
) -> dict[str, Any]:
    """The JobSpec (as JSON data) for this request, or CompatError naming what cannot map.

    ``resolve`` turns a job id of --dependency (an Isthmus id, an array id or ARRAY_TASK) into
    Isthmus job ids; an array request gives the spec of its first task (``array_specs`` makes
    them all). ``native_allowed`` gives the options a team may pass to Slurm (none without
    it)."""
    options = req.extra.get("options", {})
    _refuse_untranslated(options)
    flavors, backend, partition = _flavors(req, compat)
    team, queue = _team(req, compat, caller_team, caller_name)
    native = _native_slurm(options, team, backend, partition, native_allowed)
    spec: dict[str, Any] = {"name": job_name(req.job_name, script_path), "team": team,
                            "flavors": flavors, "backend": backend}
    if queue is not None:
        spec["queue"] = queue
    if req.qos is not None:
        priority = compat.qos.get(req.qos)
        if priority is None:
            raise CompatError(f"Invalid qos specification: {req.qos} (qos: {_known(compat.qos)})")
        spec["priority"] = priority
    spec["gang"] = _gang(req)
    if req.extra.get("time_limit_infinite") or req.time_limit_s == 0:
        raise CompatError("--time: a time limit is needed (UNLIMITED and 0 are refused here)")
    spec["max_runtime"] = req.time_limit_s or compat.default_time_limit_s
    if req.signal is not None:
        name, seconds, flags = parse_signal(req.signal)
        # R: (overlap a reservation's MaxStartDelay) has nothing to act on: no reservations.
        spec["checkpoint"] = {"grace": max(seconds, 1), "signal": name.removeprefix("SIG"),
                              "signal_batch_only": "B" in flags}
    spec["entrypoint"] = _entrypoint(req, script, compat, submit_dir)
    if req.exclusive:
        spec["backend"] = _slurm_only(backend, partition)
    if native:
        spec["native"] = {"slurm": {"options": native}}
        spec["backend"] = "slurm"  # sbatch reads them; a Kubernetes pool would drop them
    env = _env(req, environ or {})
    if submit_dir:
        env.setdefault("SLURM_SUBMIT_DIR", submit_dir)
    if env:
        spec["env"] = env
    notify = _notify(req)
    if notify:
        spec["notify"] = notify
    scheduling = _scheduling(req, resolve, now or datetime.now(UTC))
    if scheduling:
        spec["scheduling"] = scheduling
    request = {"sbatch": req.sbatch_json(), "options": req.extra.get("options", {}),
               "partition": partition}
    spec["annotations"] = {ANNOTATION: json.dumps(request, sort_keys=True)}
    return spec
