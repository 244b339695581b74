"""Render an Isthmus attempt as a Slurm batch script.

User text never becomes shell text. The batch script is fixed text plus #SBATCH directives
built from validated values; the user's command (a JSON argv), batch script and environment
travel as base64 data in quoted here-documents, are decoded into files in the job's directory,
and are started on every node by a fixed launcher (``LAUNCHER``) with ``srun``. The launcher
``exec``s the argv directly (no shell) or runs the user's script file as its own program.

Every replica is one rank: one Slurm task bound to its own GPUs (its CUDA_VISIBLE_DEVICES),
laid out as ``shape.gang_shape`` asks (several on one node, across nodes, or both). Environment
seen by every rank (torchrun style), set by the launcher from the step's SLURM_* variables:

| variable         | value                                          | from                      |
|------------------|------------------------------------------------|---------------------------|
| RANK             | this replica, 0..R-1                           | SLURM_PROCID              |
| WORLD_SIZE       | replicas in the gang (R)                       | SLURM_STEP_NUM_TASKS      |
| LOCAL_RANK       | this replica among those on its node, 0..k-1   | SLURM_LOCALID             |
| LOCAL_WORLD_SIZE | replicas on this node (k)                      | SLURM_STEP_TASKS_PER_NODE |
| NODE_RANK        | this node, 0..NNODES-1                         | SLURM_NODEID              |
| NNODES           | nodes of the gang                              | SLURM_STEP_NUM_NODES      |
| GPUS_PER_NODE    | GPUs of the gang's replicas on this node (k*G) | LOCAL_WORLD_SIZE          |
| MASTER_ADDR      | first node of the allocation                   | the batch script          |
| MASTER_PORT      | setting ``master_port`` (the job's env wins)   | the batch script          |

With one replica per node (the old layout) WORLD_SIZE = NNODES and GPUS_PER_NODE = G as before.
Also ISTHMUS_JOB_ID, ISTHMUS_ATTEMPT, ISTHMUS_JOB_DIR, the job's ``env`` and the request's env;
the job's env cannot replace the variables of the table other than MASTER_PORT.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from dataclasses import dataclass

from backends.base import SubmitRequest, Unsupported
from backends.slurm import containers as ctr
from backends.slurm.batch_files import with_batch_options
from backends.slurm.records import BatchJob
from backends.slurm.shape import GangShape, gang_shape
from broker.domain.native import NativeProblem
from broker.domain.topology import TopologyLevel

MAX_SIGNAL_SECONDS = 65535  # Slurm's limit for --signal=...@<time>
# Slurm keeps these in fixed-width integers whose top values mean "not set" / "infinite" (and
# bit 63 of a memory size means "per CPU"); a larger request cannot be expressed at all.
MAX_TIME_MINUTES = 2**32 - 3
MAX_MEMORY_MB = 2**63 - 1
MAX_CPUS_PER_TASK = 2**16 - 3
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SAFE_WORD = re.compile(r"^[A-Za-z0-9._:+-]+$")
_HEREDOC_END = "ISTHMUS_DATA_END"
# Set by the launcher for each rank; the job's env may not replace them (MASTER_PORT may).
RESERVED_ENV = ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "NODE_RANK", "NNODES", "GPUS_PER_NODE")

LAUNCHER = '''\
"""Isthmus launcher: runs one rank (one replica). Fixed text; reads its instructions from a
JSON file; its rank comes from the srun step's SLURM_* variables."""
import json, os, re, sys
with open(sys.argv[1]) as f:
    spec = json.load(f)
get = os.environ.get
node = int(get("SLURM_NODEID", "0"))
per_node = []
for part in get("SLURM_STEP_TASKS_PER_NODE", get("SLURM_TASKS_PER_NODE", "1")).split(","):
    m = re.fullmatch(r"(\\d+)(?:\\(x(\\d+)\\))?", part.strip())
    if m:
        per_node += [int(m.group(1))] * int(m.group(2) or 1)
local = per_node[node] if node < len(per_node) else 1
env = dict(os.environ)
env.update(spec["env"])
env.update({
    "MASTER_ADDR": get("ISTHMUS_MASTER_ADDR", "localhost"),
    "RANK": get("SLURM_PROCID", "0"),
    "WORLD_SIZE": get("SLURM_STEP_NUM_TASKS", get("SLURM_NTASKS", "1")),
    "LOCAL_RANK": get("SLURM_LOCALID", "0"),
    "LOCAL_WORLD_SIZE": str(local),
    "NODE_RANK": str(node),
    "NNODES": get("SLURM_STEP_NUM_NODES", get("SLURM_NNODES", "1")),
    "GPUS_PER_NODE": str(local * int(spec["gpus_per_replica"])),
})
if spec.get("batch"):  # the batch step of an sbatch script is no rank: its srun starts them
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    # and it runs where sbatch was run (or its --chdir), as Slurm runs a batch script
    where = spec["env"].get("SLURM_SUBMIT_DIR")
    if where:
        try:
            os.chdir(where)
        except OSError as exc:
            print(f"isthmus: couldn't chdir to {where!r}: {exc.strerror}: staying in "
                  f"{os.getcwd()}", file=sys.stderr, flush=True)
if "argv" in spec:
    argv = spec["argv"]
else:
    path = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), spec["script"])
    with open(path, "rb") as f:
        shebang = f.read(2) == b"#!"
    argv = [path] if shebang else ["/bin/bash", path]
sys.stdout.flush()
os.execvpe(argv[0], argv, env)
'''


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """The parts of the backend settings that shape a batch script."""

    work_dir: str = "/var/tmp/isthmus-slurm-jobs"  # noqa: S108 - a default; set per site
    python: str = "python3"
    master_port: int = 29500
    gpu_request: str = "gres"  # or "gpus-per-node"
    rack_features: bool = False  # nodes carry their rack's name as a feature (--constraint)
    extra_directives: tuple[str, ...] = ()  # admin-set, e.g. ("--account=ml",)
    container: ctr.ContainerSettings = dataclasses.field(
        default_factory=ctr.ContainerSettings)

    def __post_init__(self) -> None:
        if not _SAFE_PATH.match(self.work_dir):
            raise ValueError(
                f"work_dir {self.work_dir!r}: use an absolute path of [A-Za-z0-9._/+-]"
            )
        if not _SAFE_WORD.match(self.python.replace("/", "")):
            raise ValueError(f"python {self.python!r}: give a command name or absolute path")
        if self.gpu_request not in ("gres", "gpus-per-node"):
            raise ValueError("gpu_request: use 'gres' or 'gpus-per-node'")
        for d in self.extra_directives:
            if not d.startswith("--") or "\n" in d:
                raise ValueError(f"extra_directives: {d!r} must be one '--option=value'")


def _b64(data: bytes) -> str:
    text = base64.b64encode(data).decode()
    return "\n".join(text[i : i + 76] for i in range(0, len(text), 76))


def _check_word(what: str, value: str) -> str:
    if not _SAFE_WORD.match(value):
        raise Unsupported(f"{what} {value!r} has characters Slurm options cannot carry safely")
    return value


def _ceil_div(a: int, b: int) -> int:
    return -(-int(a) // b)


def _check_limit(field: str, value: int, most: int, unit: str) -> None:
    if value > most:
        digits = len(str(value))
        shown = str(value) if digits <= 24 else f"a {digits}-digit number of"
        raise Unsupported(f"{field} is too large for Slurm: {shown} {unit}, at most {most}")


def rack_of(domain: str | None) -> str | None:
    """'spine/rack1' -> 'rack1' (the placement's topology domain at rack level)."""
    if not domain:
        return None
    rack = domain.rstrip("/").rsplit("/", 1)[-1]
    return rack or None


def batch_job(
    request: SubmitRequest,
    settings: RenderSettings,
    *,
    partition: str,
    gpu_type: str = "",
    hold: bool = False,
    begin: str | None = None,
) -> BatchJob:
    """Everything sbatch / slurmrestd need for this attempt, including the script text."""
    spec = request.snapshot.spec
    placement = request.placement
    if not _SAFE_NAME.match(request.name):
        raise Unsupported(f"backend object name {request.name!r} is not a safe Slurm job name")
    _check_word("partition", partition)
    if gpu_type:
        _check_word("GPU type", gpu_type)
    nodes = tuple(_check_word("node", n) for n in placement.nodes)
    shape = gang_shape(spec.gang.replicas, spec.gang.gpus_per_replica, nodes,
                       one_node=placement.topology_level is TopologyLevel.NODE,
                       one_per_node=spec.gang.one_per_node,
                       tasks_per_replica=spec.gang.tasks_per_replica)
    switches, rack, constraint = _rack(request, settings)
    constraint, native = _native(request, constraint)
    grace = min(spec.checkpoint.grace, MAX_SIGNAL_SECONDS)
    memory_mb = memory_per_gpu_mb = None
    if spec.gang.memory_per_replica:
        replica_mb = _ceil_div(spec.gang.memory_per_replica, 2**20)  # exact for any size
        memory_mb, memory_per_gpu_mb = shape.memory(replica_mb)
        _check_limit("gang.memory_per_replica", max(memory_mb or 0, memory_per_gpu_mb or 0),
                     MAX_MEMORY_MB, "MiB")
    time_limit_min = max(1, _ceil_div(spec.max_runtime, 60))
    _check_limit("max_runtime", time_limit_min, MAX_TIME_MINUTES, "minutes")
    if spec.gang.cpus_per_replica:
        _check_limit("gang.cpus_per_replica", spec.gang.cpus_per_replica, MAX_CPUS_PER_TASK,
                     "CPUs")
    work_dir = settings.work_dir.rstrip("/") or "/"
    job = BatchJob(
        name=request.name,
        script="",
        comment=(f"isthmus,job={_check_word('job id', request.job_id)},"
                 f"attempt={request.attempt}" + ctr.image_comment(spec.entrypoint.ranks_image,
                                                              settings.container)),
        partition=partition,
        shape=shape,
        gpu_type=gpu_type,
        gpu_request=settings.gpu_request,
        time_limit_min=time_limit_min,
        output=f"{work_dir}/{request.name}-%j.out",
        work_dir=f"{work_dir}/{request.name}",
        signal=(f"{'B:' if spec.checkpoint.signal_batch_only else ''}"
                f"{spec.checkpoint.signal}@{grace}") if grace > 0 else None,
        switches=switches,
        rack=rack,
        constraint=constraint,
        cpus_per_task=spec.gang.cpus_per_replica,
        memory_mb=memory_mb,
        memory_per_gpu_mb=memory_per_gpu_mb,
        hold=hold,
        begin=_check_word("begin", begin) if begin else None,
        exclude=tuple(_check_word("node", n) for n in placement.exclude_nodes),
        native=native,
    )
    return _with_script(with_batch_options(job, request), request, settings)


def _rack(request: SubmitRequest, settings: RenderSettings
          ) -> tuple[int | None, str | None, str | None]:
    """(--switches, rack, --constraint) of a rack-level placement: one leaf switch, and the
    rack's node feature where the site tags nodes with their rack; all None otherwise."""
    placement = request.placement
    if placement.topology_level is not TopologyLevel.RACK:
        return None, None, None
    rack = rack_of(placement.topology_domain)
    if rack:
        _check_word("rack", rack)
    return 1, rack, rack if rack and settings.rack_features else None


def _native(request: SubmitRequest, constraint: str | None
            ) -> tuple[str | None, tuple[tuple[str, str | None], ...]]:
    """(--constraint, the other options) with the job's native.slurm.options: a constraint of
    its own is ANDed with the rack Isthmus asks for, never put in its place. The options were
    checked at submit (the team's policy) and by the spec; parsed again here, so an option
    Isthmus sets can never pass whatever was stored."""
    native = request.snapshot.spec.native
    if native is None or native.slurm is None:
        return constraint, ()
    try:
        options = native.slurm.parsed()
    except NativeProblem as exc:
        raise Unsupported(f"native.slurm.options: {exc}") from None
    rest = []
    for name, value in options:
        if name == "constraint" and value:
            constraint = f"{constraint}&({value})" if constraint else value
        else:
            rest.append((name, value))
    return constraint, tuple(rest)


def gpu_count(job: BatchJob, count: int) -> str:
    """'a100:8' (typed) or '8'."""
    return f"{job.gpu_type}:{count}" if job.gpu_type else str(count)


def per_task_gpus(shape: GangShape) -> int:
    """GPUs per task where they are asked per task (a mixed layout): the replica's share."""
    if shape.gpus_per_task is None:
        raise Unsupported(f"{shape.gpus_per_replica} GPUs a replica do not split evenly over "
                          f"its {shape.tasks_per_replica} tasks on a mixed layout")
    return shape.gpus_per_task


def shape_directives(job: BatchJob) -> list[str]:
    """Tasks, nodes and GPUs as sbatch options, from the job's GangShape."""
    shape = job.shape
    lines = [f"--nodes={shape.nodes}"] if shape.nodes is not None else []
    lines.append(f"--ntasks={shape.ntasks}")
    if shape.tasks_per_node is None:
        lines.append(f"--gpus-per-task={gpu_count(job, per_task_gpus(shape))}")
    elif shape.tasks_per_replica > 1 and shape.gpus_per_task is not None:
        # several tasks a replica: each its share of the GPUs, bound (as --gpus-per-task
        # binds them in the script's own srun steps)
        lines.append(f"--ntasks-per-node={shape.ntasks_per_node}")
        lines.append(f"--gpus-per-task={gpu_count(job, shape.gpus_per_task)}")
        # a typed --gpus-per-task alone binds nothing (the tasks saw no GPU): bind explicitly
        lines.append(f"--gpu-bind=per_task:{shape.gpus_per_task}")
    else:
        gpu = gpu_count(job, shape.gpus_per_node)
        lines.append(f"--ntasks-per-node={shape.ntasks_per_node}")
        lines.append(f"--gres=gpu:{gpu}" if job.gpu_request == "gres"
                     else f"--gpus-per-node={gpu}")
    if shape.nodelist:
        lines.append(f"--nodelist={','.join(shape.nodelist)}")
    return lines


def directives(job: BatchJob, settings: RenderSettings) -> list[str]:
    lines = [
        f"--job-name={job.name}",
        f"--comment={job.comment}",
        f"--partition={job.partition}",
        *shape_directives(job),
        f"--time={job.time_limit_min}",
        "--no-requeue",
        f"--output={job.user_output or job.output}",
        f"--chdir={settings.work_dir}",
    ]
    if job.user_error:
        lines.append(f"--error={job.user_error}")
    if job.exclusive:
        lines.append("--exclusive")
    if job.signal:
        lines.append(f"--signal={job.signal}")
    if job.switches:
        lines.append(f"--switches={job.switches}")
    if job.exclude:  # held for a starving gang (policies/queue_guard.py)
        lines.append(f"--exclude={','.join(job.exclude)}")
    if job.constraint:
        lines.append(f"--constraint={job.constraint}")
    if job.cpus_per_task:
        lines.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.memory_mb:
        lines.append(f"--mem={job.memory_mb}M")
    if job.memory_per_gpu_mb:
        lines.append(f"--mem-per-gpu={job.memory_per_gpu_mb}M")
    if job.hold:
        lines.append("--hold")
    if job.begin:
        lines.append(f"--begin={job.begin}")
    # the team's native options, before the site's own: sbatch takes an option's last value
    lines.extend(f"--{name}" if value is None else f"--{name}={value}"
                 for name, value in job.native)
    lines.extend(settings.extra_directives)
    return lines


def _payload(request: SubmitRequest) -> tuple[dict[str, object], bytes | None]:
    spec = request.snapshot.spec
    env = {**spec.env, **request.env}
    env.setdefault("ISTHMUS_JOB_ID", request.job_id)
    env.setdefault("ISTHMUS_ATTEMPT", str(request.attempt))
    data: dict[str, object] = {"env": env, "gpus_per_replica": spec.gang.gpus_per_replica}
    if spec.entrypoint.launcher == "batch":
        data["batch"] = True
    if spec.entrypoint.command is not None:
        data["argv"] = list(spec.entrypoint.command)
        return data, None
    assert spec.entrypoint.script is not None  # the spec guarantees one of the two
    data["script"] = "user-script"
    return data, spec.entrypoint.script.encode()


def srun_line(shape: GangShape, settings: RenderSettings) -> str:
    opts = " ".join(shape.srun_options())
    return (f"srun {opts} --kill-on-bad-exit=1 {settings.python} "
            '"$ISTHMUS_JOB_DIR/launch.py" "$ISTHMUS_JOB_DIR/job.json" &')


def _launch(request: SubmitRequest, job: BatchJob, settings: RenderSettings) -> list[str]:
    """How the launcher starts: one rank per replica under srun, or (entrypoint.launcher
    'batch', as sbatch runs a script) once, here in the batch step, where the script's own srun
    starts the ranks. A job with an image starts its ranks inside it (containers.py)."""
    shape = job.shape
    if request.snapshot.spec.entrypoint.ranks_image and settings.container.runs_images:
        return ctr.rank_lines(request, job, settings.container, settings.python)
    if request.snapshot.spec.entrypoint.launcher != "batch":
        return [
            "# One task per replica, each bound to its own GPUs; srun forwards USR1 to every "
            "rank:",
            "# the checkpoint signal (--signal, or a cancel).",
            srun_line(shape, settings),
        ]
    return [
        "# A job whose accounting shows no step beside the batch step failed before srun could",
        "# launch (an orchestration failure). Here the batch step is the user's script, which",
        "# may fail before its own srun or use none: this one-task step records that srun works.",
        "srun --nodes=1 --ntasks=1 --quiet true >/dev/null 2>&1 || true",
        "# The script itself gets USR1 (the checkpoint signal), as with sbatch --signal=B:...",
        f'{settings.python} "$ISTHMUS_JOB_DIR/launch.py" "$ISTHMUS_JOB_DIR/job.json" &',
    ]


def _sig(request: SubmitRequest) -> str:
    """The stop signal as kill and trap take it (a name without SIG, or a number)."""
    sig = request.snapshot.spec.checkpoint.signal
    if not re.fullmatch(r"[A-Z0-9]{1,8}", sig):  # the spec's pattern already holds it
        raise Unsupported(f"checkpoint.signal {sig!r} is not a signal")
    return sig


def _trapped(request: SubmitRequest) -> str:
    """The signals the batch shell forwards as the stop signal: it, and USR1 (a cancel's)."""
    sig = _sig(request)
    return sig if sig in ("USR1", "10") else f"{sig} USR1"


def _with_script(job: BatchJob, request: SubmitRequest, settings: RenderSettings) -> BatchJob:
    payload, user_script = _payload(request)
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {d}" for d in directives(job, settings)]
    lines += [
        "# Rendered by Isthmus. The job's command, script and environment are base64 data",
        "# below; nothing the user wrote is interpreted by this shell.",
        "set -u",
        "# No requeue after a node failure: Isthmus retries with its own policy. --no-requeue",
        "# says so, but slurmrestd v0.0.38 cannot, so the job also clears the flag itself.",
        'scontrol update JobId="$SLURM_JOB_ID" Requeue=0 >/dev/null 2>&1 || true',
        "# The job's directory and files are its owner's alone (0700 / 0600): job.json holds",
        "# the job's environment and its progress token.",
        "umask 077",
        f"ISTHMUS_JOB_DIR={job.work_dir}",
        'mkdir -p -m 0700 "$ISTHMUS_JOB_DIR"',
        'chmod 0700 "$ISTHMUS_JOB_DIR"',
        f"cat > \"$ISTHMUS_JOB_DIR/launch.py\" <<'{_HEREDOC_END}'",
        LAUNCHER.rstrip("\n"),
        _HEREDOC_END,
        f"base64 -d > \"$ISTHMUS_JOB_DIR/job.json\" <<'{_HEREDOC_END}'",
        _b64(json.dumps(payload, sort_keys=True).encode()),
        _HEREDOC_END,
    ]
    lines += ctr.file_lines(request, job, settings.container, _b64, _HEREDOC_END)
    if user_script is not None:
        lines += [
            f"base64 -d > \"$ISTHMUS_JOB_DIR/user-script\" <<'{_HEREDOC_END}'",
            _b64(user_script),
            _HEREDOC_END,
            'chmod 700 "$ISTHMUS_JOB_DIR/user-script"',
        ]
    lines += [
        "export ISTHMUS_JOB_DIR",
        'ISTHMUS_MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export ISTHMUS_MASTER_ADDR",
        f"export MASTER_PORT={settings.master_port}",
        *_launch(request, job, settings),
        "ISTHMUS_STEP=$!",
        # the stop signal (checkpoint.signal: a name or number the spec checked) goes on; so
        # does USR1, which is how a cancel or a preemption asks the batch shell to stop (the
        # adapter's cancel), turned into the job's own stop signal
        f"trap 'kill -{_sig(request)} \"$ISTHMUS_STEP\" 2>/dev/null' {_trapped(request)}",
        'wait "$ISTHMUS_STEP"; rc=$?',
        'while kill -0 "$ISTHMUS_STEP" 2>/dev/null; do wait "$ISTHMUS_STEP"; rc=$?; done',
        'exit "$rc"',
    ]
    script = "\n".join(lines) + "\n"
    return dataclasses.replace(job, script=script)


def render(
    request: SubmitRequest,
    *,
    partition: str,
    settings: RenderSettings | None = None,
    gpu_type: str = "",
) -> str:
    """The exact batch script Isthmus would submit for this request (for `isthmus render`)."""
    return batch_job(request, settings or RenderSettings(), partition=partition,
                     gpu_type=gpu_type).script
