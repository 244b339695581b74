"""Read an sbatch request as sbatch 22.05+ does: #SBATCH directives, SBATCH_* variables, options.

Precedence is sbatch's: the script's directives, then the SBATCH_* environment over them, then
the command line over both. Directives are read from the top of the script up to its first
command (a line that is neither blank nor a comment); ``## SBATCH`` and ``# SBATCH`` are plain
comments; in a directive line, ``#`` starts a comment, single and double quotes group (no
backslash escapes, as in Slurm's own reader).

Options are declared once in ``OPTIONS`` and parsed with argparse (getopt-like: long options may
be abbreviated, short ones clustered, the first non-option word on the command line is the
script and everything after it belongs to the script). ``normalise`` turns the merged options
into ``SbatchRequest``, the request ``isbatch --parse-only --json`` prints.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

from broker.sbatch import values as v
from broker.sbatch.values import SbatchError

# (long name, short letter or "", kind): "v" takes a value, "f" a flag, "o" an optional value
# (only as --opt=value, as getopt does), "c" a counting flag.
OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("account", "A", "v"), ("acctg-freq", "", "v"), ("array", "a", "v"), ("batch", "", "v"),
    ("bb", "", "v"), ("bbf", "", "v"), ("begin", "b", "v"), ("chdir", "D", "v"),
    ("cluster-constraint", "", "v"), ("clusters", "M", "v"), ("comment", "", "v"),
    ("constraint", "C", "v"), ("container", "", "v"), ("contiguous", "", "f"),
    ("core-spec", "S", "v"), ("cores-per-socket", "", "v"), ("cpu-freq", "", "v"),
    ("cpus-per-gpu", "", "v"), ("cpus-per-task", "c", "v"), ("deadline", "", "v"),
    ("delay-boot", "", "v"), ("dependency", "d", "v"), ("distribution", "m", "v"),
    ("error", "e", "v"), ("exclude", "x", "v"), ("exclusive", "", "o"), ("export", "", "v"),
    ("export-file", "", "v"), ("extra-node-info", "B", "v"), ("get-user-env", "", "o"),
    ("gid", "", "v"), ("gpu-bind", "", "v"), ("gpu-freq", "", "v"), ("gpus", "G", "v"),
    ("gpus-per-node", "", "v"), ("gpus-per-socket", "", "v"), ("gpus-per-task", "", "v"),
    ("gres", "", "v"), ("gres-flags", "", "v"), ("hint", "", "v"), ("hold", "H", "f"),
    ("ignore-pbs", "", "f"), ("input", "i", "v"), ("job-name", "J", "v"),
    ("kill-on-invalid-dep", "", "v"), ("licenses", "L", "v"), ("mail-type", "", "v"),
    ("mail-user", "", "v"), ("mcs-label", "", "v"), ("mem", "", "v"), ("mem-bind", "", "v"),
    ("mem-per-cpu", "", "v"), ("mem-per-gpu", "", "v"), ("mincpus", "", "v"),
    ("network", "", "v"), ("nice", "", "o"), ("no-kill", "k", "o"), ("no-requeue", "", "f"),
    ("nodefile", "F", "v"), ("nodelist", "w", "v"), ("nodes", "N", "v"), ("ntasks", "n", "v"),
    ("ntasks-per-core", "", "v"), ("ntasks-per-gpu", "", "v"), ("ntasks-per-node", "", "v"),
    ("ntasks-per-socket", "", "v"), ("open-mode", "", "v"), ("output", "o", "v"),
    ("overcommit", "O", "f"), ("oversubscribe", "s", "f"), ("parsable", "", "f"),
    ("partition", "p", "v"), ("power", "", "v"), ("prefer", "", "v"), ("priority", "", "v"),
    ("profile", "", "v"), ("propagate", "", "o"), ("qos", "q", "v"), ("quiet", "Q", "f"),
    ("reboot", "", "f"), ("requeue", "", "f"), ("reservation", "", "v"), ("signal", "", "v"),
    ("sockets-per-node", "", "v"), ("spread-job", "", "f"), ("switches", "", "v"),
    ("test-only", "", "f"), ("thread-spec", "", "v"), ("threads-per-core", "", "v"),
    ("time", "t", "v"), ("time-min", "", "v"), ("tmp", "", "v"), ("uid", "", "v"),
    ("use-min-nodes", "", "f"), ("verbose", "v", "c"), ("wait", "W", "f"),
    ("wait-all-nodes", "", "v"), ("wckey", "", "v"), ("wrap", "", "v"),
)
# isbatch's own options: command line only.
ISBATCH_OPTIONS: tuple[tuple[str, str, str], ...] = (("parse-only", "", "f"), ("json", "", "f"))

# SBATCH_* input variables (sbatch(1), "INPUT ENVIRONMENT VARIABLES") -> option.
ENV_OPTIONS: dict[str, str] = {
    "SBATCH_ACCOUNT": "account", "SBATCH_ACCTG_FREQ": "acctg-freq",
    "SBATCH_ARRAY_INX": "array", "SBATCH_BATCH": "batch", "SBATCH_CLUSTERS": "clusters",
    "SBATCH_CONSTRAINT": "constraint", "SBATCH_CONTAINER": "container",
    "SBATCH_CORE_SPEC": "core-spec", "SBATCH_CPUS_PER_GPU": "cpus-per-gpu",
    "SBATCH_DEBUG": "verbose", "SBATCH_DELAY_BOOT": "delay-boot",
    "SBATCH_DISTRIBUTION": "distribution", "SBATCH_EXCLUSIVE": "exclusive",
    "SBATCH_EXPORT": "export", "SBATCH_GET_USER_ENV": "get-user-env",
    "SBATCH_GPU_BIND": "gpu-bind", "SBATCH_GPU_FREQ": "gpu-freq", "SBATCH_GPUS": "gpus",
    "SBATCH_GPUS_PER_NODE": "gpus-per-node", "SBATCH_GPUS_PER_TASK": "gpus-per-task",
    "SBATCH_GRES": "gres", "SBATCH_GRES_FLAGS": "gres-flags", "SBATCH_HINT": "hint",
    "SBATCH_IGNORE_PBS": "ignore-pbs", "SBATCH_JOB_NAME": "job-name",
    "SBATCH_MEM_BIND": "mem-bind", "SBATCH_MEM_PER_CPU": "mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "mem-per-gpu", "SBATCH_MEM_PER_NODE": "mem",
    "SBATCH_NETWORK": "network", "SBATCH_NO_KILL": "no-kill",
    "SBATCH_NO_REQUEUE": "no-requeue", "SBATCH_OPEN_MODE": "open-mode",
    "SBATCH_OVERCOMMIT": "overcommit", "SBATCH_PARTITION": "partition",
    "SBATCH_POWER": "power", "SBATCH_PROFILE": "profile", "SBATCH_QOS": "qos",
    "SBATCH_REQ_SWITCH": "switches", "SBATCH_REQUEUE": "requeue",
    "SBATCH_RESERVATION": "reservation", "SBATCH_SIGNAL": "signal",
    "SBATCH_SPREAD_JOB": "spread-job", "SBATCH_THREAD_SPEC": "thread-spec",
    "SBATCH_THREADS_PER_CORE": "threads-per-core", "SBATCH_TIMELIMIT": "time",
    "SBATCH_USE_MIN_NODES": "use-min-nodes", "SBATCH_WAIT": "wait",
    "SBATCH_WAIT_ALL_NODES": "wait-all-nodes", "SBATCH_WCKEY": "wckey",
}
_KIND = {name: kind for name, _short, kind in OPTIONS + ISBATCH_OPTIONS}
_SHORT_OPTIONAL = {short: name for name, short, kind in OPTIONS if kind == "o" and short}
_SHORT_KIND = {short: kind for _name, short, kind in OPTIONS if short}
NOT_A_SCRIPT = (
    "This does not look like a batch script.  The first line must start with #! followed by "
    "the path to an interpreter.  For instance: #!/bin/sh"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SbatchError(message, exit_code=255)


def _parser(*, command_line: bool) -> _Parser:
    parser = _Parser(prog="isbatch", add_help=False, allow_abbrev=True)
    for name, short, kind in OPTIONS + (ISBATCH_OPTIONS if command_line else ()):
        flags = [f"--{name}"] + ([f"-{short}"] if short else [])
        dest = name.replace("-", "_")
        if kind == "v":
            parser.add_argument(*flags, dest=dest, default=None)
        elif kind == "f":
            parser.add_argument(*flags, dest=dest, action="store_true", default=False)
        elif kind == "c":
            parser.add_argument(*flags, dest=dest, action="count", default=0)
        else:
            parser.add_argument(*flags, dest=dest, nargs="?", const="", default=None)
    if command_line:
        parser.add_argument("-h", "--help", dest="help", action="store_true", default=False)
        parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def _long_name(word: str) -> str | None:
    """The option a ``--word`` names, resolving a unique abbreviation as getopt does."""
    if word in _KIND:
        return word
    candidates = [n for n in _KIND if n.startswith(word)]
    return candidates[0] if len(candidates) == 1 else None


def _optional_arg_form(tokens: Sequence[str]) -> list[str]:
    """getopt gives an optional argument only as ``--opt=value``: a bare ``--exclusive`` must
    not swallow the next word (argparse would), so it becomes ``--exclusive=``. Words from the
    first non-option on (the script and its arguments) are left alone."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok == "--" or not tok.startswith("-") or tok == "-":
            out += tokens[i - 1:]
            break
        if tok.startswith("--"):
            name = _long_name(tok[2:].split("=", 1)[0])
            if name and "=" not in tok:
                if _KIND[name] == "o":
                    tok = f"--{name}="
                elif _KIND[name] == "v" and i < len(tokens):
                    out += [tok, tokens[i]]
                    i += 1
                    continue
        elif len(tok) == 2:
            if tok[1] in _SHORT_OPTIONAL:
                tok = f"--{_SHORT_OPTIONAL[tok[1]]}="
            elif _SHORT_KIND.get(tok[1]) == "v" and i < len(tokens):
                out += [tok, tokens[i]]
                i += 1
                continue
        out.append(tok)
    return out


def _split_directive(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    lexer.escape = ""  # Slurm's reader has no backslash escapes
    return list(lexer)


def directive_lines(script: str) -> list[list[str]]:
    """The option words of each #SBATCH line before the script's first command."""
    lines = script.splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise SbatchError(NOT_A_SCRIPT)
    out: list[list[str]] = []
    for line in lines[1:]:
        if line.startswith("#SBATCH"):
            try:
                out.append(_split_directive(line[len("#SBATCH"):]))
            except ValueError as exc:  # an unclosed quote
                raise SbatchError(f"Invalid directive found in batch script: {line}") from exc
            continue
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#"):
            break
    return out


# argparse's time grows with the square of the options in one call: a script of 10,000
# #SBATCH lines took 13 s in one call. Its lines are read in groups of whole lines instead.
_WORDS_PER_CALL = 256


def _parse_lines(parser: _Parser, lines: list[list[str]], ns: argparse.Namespace) -> None:
    group: list[str] = []
    for words in lines:
        if group and len(group) + len(words) > _WORDS_PER_CALL:
            _parse_into(parser, group, ns)
            group = []
        group += words
    if group:
        _parse_into(parser, group, ns)


def env_tokens(environ: Mapping[str, str]) -> list[str]:
    tokens = []
    for var, option in sorted(ENV_OPTIONS.items()):
        if var not in environ:
            continue
        kind = _KIND[option]
        if kind == "v":
            tokens.append(f"--{option}={environ[var]}")
        elif kind == "o":
            value = environ[var]
            tokens.append(f"--{option}={value if value in ('user', 'mcs') else ''}")
        else:
            tokens.append(f"--{option}")
    return tokens


def _parse_into(parser: _Parser, tokens: Sequence[str], ns: argparse.Namespace) -> None:
    _ns, extra = parser.parse_known_args(_optional_arg_form(tokens), namespace=ns)
    for word in extra:
        if word.startswith("-"):
            raise SbatchError(f"unrecognized option '{word}'", exit_code=255)
        raise SbatchError(f"Invalid directive found in batch script: {word}")


@dataclass(frozen=True)
class CommandLine:
    """The first reading of the command line: what to read and how to answer."""

    options: argparse.Namespace
    script_path: str | None
    script_args: tuple[str, ...]


def read_command_line(argv: Sequence[str]) -> CommandLine:
    ns = argparse.Namespace()
    _parse_into(_parser(command_line=True), argv, ns)
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    return CommandLine(ns, command[0] if command else None, tuple(command[1:]))


def merge(
    script: str | None, environ: Mapping[str, str], argv: Sequence[str]
) -> argparse.Namespace:
    """All options, script < SBATCH_* environment < command line (last one wins)."""
    ns = argparse.Namespace()
    if script is not None:
        _parse_lines(_parser(command_line=False), directive_lines(script), ns)
    _parse_into(_parser(command_line=False), env_tokens(environ), ns)
    _parse_into(_parser(command_line=True), argv, ns)
    return ns


@dataclass(frozen=True)
class SbatchRequest:
    """The normalised request (the ``sbatch`` member of ``isbatch --parse-only --json``)."""

    job_name: str | None
    partition: str | None
    replicas: int | None
    gpus_per_node: int | None
    gpu_type: str | None
    time_limit_s: int | None
    cpus_per_task: int | None
    mem_mb: int | None
    array: str | None
    dependency: str | None
    signal: str | None
    constraint: str | None
    account: str | None
    qos: str | None
    exclusive: bool
    wrap: str | None
    # Not part of the "sbatch" member: the rest of what was given, for mapping and display.
    extra: dict[str, Any] = field(default_factory=dict)

    def sbatch_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return data


def normalise(ns: argparse.Namespace) -> SbatchRequest:
    """Check every value the way sbatch does and derive nodes, GPUs per node and memory."""
    nodes, nodes_max, ntasks, tpn = _tasks(ns)
    gpus_per_node, gpu_type = v.gpu_request(ns.gres, ns.gpus_per_node, ns.gpus_per_task,
                                            ns.gpus, nodes, tpn)
    cpus_per_task = (v.parse_positive(ns.cpus_per_task, "--cpus-per-task")
                     if ns.cpus_per_task is not None else None)
    cpus_per_gpu = (v.parse_positive(ns.cpus_per_gpu, "--cpus-per-gpu")
                    if ns.cpus_per_gpu is not None else None)
    time_limit = v.parse_time(ns.time) if ns.time is not None else None
    mem_mb = _mem_mb(ns, gpus_per_node, cpus_per_task, tpn)
    array = v.parse_array(ns.array) if ns.array is not None else None
    _check_kept_as_given(ns)
    given = {
        k: val for k, val in sorted(vars(ns).items())
        if k not in ("command", "help", "parse_only", "json") and val not in (None, False, 0)
    }
    extra: dict[str, Any] = {
        "nodes_max": nodes_max,
        "ntasks": ntasks,
        "ntasks_per_node": tpn,
        "cpus_per_gpu": cpus_per_gpu,
        "time_limit_infinite": ns.time is not None and time_limit is None,
        "array_indices": list(array.indices) if array else None,
        "array_limit": array.limit if array else None,
        "begin": ns.begin,
        "output": ns.output,
        "error": ns.error,
        "export": ns.export,
        "chdir": ns.chdir,
        "mail_type": ns.mail_type,
        "mail_user": ns.mail_user,
        "hold": bool(ns.hold),
        "options": given,
    }
    return SbatchRequest(
        job_name=ns.job_name,
        partition=ns.partition,
        replicas=nodes,
        gpus_per_node=gpus_per_node,
        gpu_type=gpu_type,
        time_limit_s=time_limit,
        cpus_per_task=cpus_per_task,
        mem_mb=mem_mb,
        array=ns.array,
        dependency=ns.dependency,
        signal=ns.signal,
        constraint=ns.constraint,
        account=ns.account,
        qos=ns.qos,
        exclusive=ns.exclusive is not None,
        wrap=ns.wrap,
        extra=extra,
    )


def _tasks(ns: argparse.Namespace) -> tuple[int, int | None, int | None, int | None]:
    """(nodes, most nodes, tasks, tasks per node) as sbatch derives them."""
    nodes = nodes_max = None
    if ns.nodes is not None:
        nodes, nodes_max = v.parse_nodes(ns.nodes)
    ntasks = v.parse_positive(ns.ntasks, "--ntasks") if ns.ntasks is not None else None
    tpn = (v.parse_positive(ns.ntasks_per_node, "--ntasks-per-node")
           if ns.ntasks_per_node is not None else None)
    if nodes is None:
        # sbatch derives the node count from the tasks when -N is not given.
        nodes = -(-ntasks // tpn) if ntasks and tpn else 1
    if tpn is None and ntasks is not None:
        tpn = -(-ntasks // nodes)
    return nodes, nodes_max, ntasks, tpn


def _mem_mb(ns: argparse.Namespace, gpus_per_node: int | None, cpus_per_task: int | None,
            tpn: int | None) -> int | None:
    """Memory per node in MiB: --mem, else --mem-per-gpu or --mem-per-cpu times the node's
    GPUs or CPUs."""
    if ns.mem is not None:
        return v.parse_mem_mb(ns.mem, "--mem")
    if ns.mem_per_gpu is not None:
        return v.parse_mem_mb(ns.mem_per_gpu, "--mem-per-gpu") * (gpus_per_node or 0)
    if ns.mem_per_cpu is not None:
        cpus = (cpus_per_task or 1) * (tpn or 1)
        return v.parse_mem_mb(ns.mem_per_cpu, "--mem-per-cpu") * cpus
    return None


def _check_kept_as_given(ns: argparse.Namespace) -> None:
    """Values kept in their sbatch spelling, checked the way sbatch checks them."""
    if ns.dependency is not None:
        v.parse_dependency(ns.dependency)
    if ns.signal is not None:
        v.parse_signal(ns.signal)
    if ns.time_min is not None:
        v.parse_time(ns.time_min, "--time-min")
    if ns.begin is not None:
        v.parse_begin(ns.begin, datetime.now(UTC))


def wrap_script(command: str) -> str:
    """The script sbatch builds for --wrap."""
    return f"#!/bin/sh\n# This script was created by isbatch --wrap.\n\n{command}\n"


@dataclass(frozen=True)
class Parsed:
    request: SbatchRequest
    script: str
    script_args: tuple[str, ...]
    command_line: CommandLine


def parse(argv: Sequence[str], environ: Mapping[str, str], read_script: Any) -> Parsed:
    """The whole reading. ``read_script(path or None)`` returns the script's text (None: stdin)."""
    cli = read_command_line(argv)
    wrap = cli.options.wrap
    if wrap is not None and cli.script_path is not None:
        raise SbatchError("script argument not permitted with --wrap option")
    if wrap is not None:
        script = wrap_script(wrap)
        ns = merge(None, environ, argv)
    else:
        script = read_script(cli.script_path)
        ns = merge(script, environ, argv)
    if wrap is not None:
        ns.wrap = wrap
    return Parsed(normalise(ns), script, cli.script_args, cli)
