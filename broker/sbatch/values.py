"""Values of single sbatch options, parsed the way Slurm 22.05+ parses them.

Every function raises ``SbatchError`` with sbatch's own wording ("Invalid --time
specification") so that a user sees the message they know, naming the option.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.domain import slurm_time

DEPENDENCY_TYPES = ("after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok")
_INT = re.compile(r"^\d+$")
_JOB_ID = re.compile(r"^[0-9a-z]+(_\d+)?$")  # Slurm ids, and Isthmus ids (base32)
_MEM = re.compile(r"^(\d+)([KMGTkmgt]?)$")
_MEM_FACTOR_MB = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2}
MAX_SIGNAL_SECONDS = 65535


class SbatchError(Exception):
    """An option sbatch would refuse. ``exit_code`` follows sbatch: 255 for an unknown option
    (getopt's refusal), 1 for a bad value."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def parse_time(text: str, option: str = "--time") -> int | None:
    """Seconds from a Slurm time string (broker.domain.slurm_time.parse; None for INFINITE /
    UNLIMITED), refused with sbatch's own words."""
    try:
        return slurm_time.parse(text)
    except ValueError:
        raise SbatchError(f"Invalid {option} specification") from None


def parse_mem_mb(text: str, option: str = "--mem") -> int:
    """MiB from an integer with an optional K/M/G/T suffix (default M), as Slurm rounds up."""
    m = _MEM.match(text.strip())
    if not m:
        raise SbatchError(f"Invalid {option} specification")
    mb = int(m.group(1)) * _MEM_FACTOR_MB[m.group(2).lower()]
    return int(-(-mb // 1))


@dataclass(frozen=True, slots=True)
class GpuCount:
    gpu_type: str | None
    count: int


def parse_gpu_count(text: str, option: str) -> GpuCount:
    """``[type:]N`` of --gpus, --gpus-per-node and --gpus-per-task."""
    parts = text.strip().split(":")
    if len(parts) > 2 or "," in text or not parts[-1]:
        raise SbatchError(f"Invalid {option} specification")
    if not _INT.match(parts[-1]):
        raise SbatchError(f"Invalid {option} specification")
    gpu_type = parts[0] if len(parts) == 2 else None
    if gpu_type == "":
        raise SbatchError(f"Invalid {option} specification")
    return GpuCount(gpu_type, int(parts[-1]))


def parse_gres(text: str) -> GpuCount | None:
    """The GPU entry of ``--gres=gpu[:type][:N][,...]`` (None when it names no GPU).

    Only GPUs are generic resources here: another name is refused like an unknown gres.
    """
    found: GpuCount | None = None
    for entry in text.strip().split(","):
        parts = entry.split(":")
        if parts[0] == "gres" and len(parts) > 1:  # the legacy "gres:" prefix
            parts = parts[1:]
        if parts[0] != "gpu" or len(parts) > 3 or found is not None:
            raise SbatchError("Invalid generic resource (gres) specification")
        rest = parts[1:]
        count, gpu_type = 1, None
        if rest and _INT.match(rest[-1]):
            count = int(rest.pop())
        elif len(rest) == 2:
            raise SbatchError("Invalid generic resource (gres) specification")
        if rest:
            gpu_type = rest[0]
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", gpu_type):
                raise SbatchError("Invalid generic resource (gres) specification")
        found = GpuCount(gpu_type, count)
    return found


def parse_nodes(text: str) -> tuple[int, int | None]:
    """``N`` or ``N-M`` (minimum and maximum node count)."""
    value = text.strip()
    low, _, high = value.partition("-")
    if not _INT.match(low) or (high and not _INT.match(high)):
        raise SbatchError(f'"{value}" is not a valid node count')
    lo, hi = int(low), int(high) if high else None
    if lo == 0:
        # Slurm 22.05 turns -N 0 into one node; a gang of no nodes is a mistake here.
        raise SbatchError(f"Invalid node count -N/--nodes={value}: at least 1 node is needed")
    if hi is not None and hi < lo:
        raise SbatchError(f'"{value}" is not a valid node count')
    return lo, hi


def parse_positive(text: str, option: str) -> int:
    value = text.strip()
    if not _INT.match(value) or int(value) == 0:
        raise SbatchError(f'Invalid numeric value "{value}" for {option}.')
    return int(value)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]
    limit: int | None  # the %N throttle


MAX_ARRAY_TASKS = 10_000
MAX_ARRAY_INDEX = 4_000_000
"""The highest task index (Slurm's MaxArraySize is at most 4,000,001)."""


def parse_array(text: str) -> ArraySpec:
    """``1-10``, ``0-15:4``, ``1,3,5-7`` with an optional ``%N`` limit."""
    value = text.strip()
    body, pct, limit_text = value.partition("%")
    limit = None
    if pct:
        if not _short_int(limit_text) or int(limit_text) == 0:
            raise SbatchError("Invalid job array specification")
        limit = int(limit_text)
    ranges: list[range] = []
    count = 0
    for item in body.split(",", MAX_ARRAY_TASKS + 1):
        rng, colon, step_text = item.partition(":")
        low, dash, high = rng.partition("-")
        if not _short_int(low) or (dash and not _short_int(high)) \
                or (colon and not _short_int(step_text)):
            raise SbatchError("Invalid job array specification")
        step = int(step_text) if colon else 1
        lo, hi = int(low), int(high) if dash else int(low)
        if step <= 0 or hi < lo or (colon and not dash) or hi > MAX_ARRAY_INDEX:
            raise SbatchError("Invalid job array specification")
        ranges.append(range(lo, hi + 1, step))
        count += len(ranges[-1])  # counted, not listed: "0-50000000" costs nothing
        if count > MAX_ARRAY_TASKS:
            raise SbatchError(f"Invalid job array specification: more than {MAX_ARRAY_TASKS} "
                              "tasks")
    return ArraySpec(tuple(sorted({i for r in ranges for i in r})), limit)


def _short_int(text: str) -> bool:
    """Digits only, and few enough to be an index (a million digits never reach int())."""
    return len(text) <= 10 and bool(_INT.match(text))


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: str  # afterok, afterany, afternotok, after, aftercorr, afterburstbuffer, singleton
    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DependencySpec:
    items: tuple[Dependency, ...]
    any_of: bool  # "?" separated: one satisfied dependency is enough


def parse_dependency(text: str) -> DependencySpec:
    """``type:id[:id...][,type:id...]`` (all) or with ``?`` (any); ``singleton``."""
    value = text.strip()
    if "," in value and "?" in value:
        raise SbatchError("Invalid --dependency specification")
    any_of = "?" in value
    items = []
    for part in value.split("?" if any_of else ","):
        if part == "singleton":
            items.append(Dependency("singleton", ()))
            continue
        kind, _, ids = part.partition(":")
        job_ids = tuple(i.split("+", 1)[0] for i in ids.split(":")) if ids else ()
        if kind not in DEPENDENCY_TYPES or not job_ids:
            raise SbatchError("Invalid --dependency specification")
        if not all(_JOB_ID.match(i) for i in job_ids):
            raise SbatchError("Invalid --dependency specification")
        items.append(Dependency(kind, job_ids))
    return DependencySpec(tuple(items), any_of)


def parse_signal(text: str) -> tuple[str, int, str]:
    """``[{R|B}:]<sig>[@<seconds>]`` -> (signal name, seconds before the end, flags)."""
    value = text.strip()
    flags = ""
    m = re.match(r"^([RB]{1,2}):(.*)$", value)
    if m:
        flags, value = m.group(1), m.group(2)
    sig, _, when = value.partition("@")
    seconds = 60
    if when:
        if not _INT.match(when) or int(when) > MAX_SIGNAL_SECONDS:
            raise SbatchError("Invalid --signal specification")
        seconds = int(when)
    if _INT.match(sig):
        number = int(sig)
        if not 1 <= number <= 64:
            raise SbatchError("Invalid --signal specification")
    else:
        name = sig.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name not in _signal.Signals.__members__:
            raise SbatchError("Invalid --signal specification")
        number = _signal.Signals[name].value
    # The canonical name (SIGIOT is SIGABRT); real-time signals by number, as kill takes them.
    known = {s.value: s.name for s in _signal.Signals if s.value < 32}
    return known.get(number, str(number)), seconds, flags


_BEGIN_WORDS = {"midnight": (0, 0), "noon": (12, 0), "fika": (15, 0), "teatime": (16, 0)}
_UNITS_S = {"": 1, "second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


MAX_BEGIN_AHEAD_S = 366 * 86400
"""A --begin of now+N is at most a year ahead (now+999999999week overflowed the date)."""


def parse_begin(text: str, now: datetime) -> datetime:
    """Absolute start time from the --begin forms: now[+N[units]], HH:MM[:SS],
    YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], midnight, noon, fika, teatime, today, tomorrow."""
    value = text.strip().lower()
    m = re.match(r"^now(?:\+(\d{1,12})(?:(second|minute|hour|day|week)s?)?)?$", value)
    if m:
        seconds = int(m.group(1) or 0) * _UNITS_S[m.group(2) or ""]
        if seconds > MAX_BEGIN_AHEAD_S:
            raise SbatchError("Invalid --begin specification: more than a year ahead")
        return now + timedelta(seconds=seconds)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if value in ("today", "tomorrow"):
        return today + timedelta(days=1 if value == "tomorrow" else 0)
    if value in _BEGIN_WORDS:
        h, mi = _BEGIN_WORDS[value]
        at = today.replace(hour=h, minute=mi)
        return at if at > now else at + timedelta(days=1)
    formats = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y", "%m/%d")
    for fmt in formats:
        try:
            parsed = datetime.strptime(value.upper() if "T" in fmt else value, fmt)
        except ValueError:
            continue
        if fmt == "%m/%d":
            parsed = parsed.replace(year=now.year)
        return parsed.replace(tzinfo=now.tzinfo)
    m = re.match(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$", value)
    if m and int(m.group(1)) < 24 and int(m.group(2)) < 60:
        at = today.replace(hour=int(m.group(1)), minute=int(m.group(2)),
                           second=int(m.group(3) or 0))
        return at if at > now else at + timedelta(days=1)
    raise SbatchError("Invalid --begin specification")


def gpu_request(
    gres: str | None, gpus_per_node: str | None, gpus_per_task: str | None, gpus: str | None,
    nodes: int, tasks_per_node: int | None,
) -> tuple[int | None, str | None]:
    """(GPUs per node, GPU type): --gpus over --gpus-per-task over --gpus-per-node over --gres."""
    per_node: GpuCount | None = None
    if gres is not None:
        per_node = parse_gres(gres)
    if gpus_per_node is not None:
        per_node = parse_gpu_count(gpus_per_node, "--gpus-per-node")
    if gpus_per_task is not None:
        per_task = parse_gpu_count(gpus_per_task, "--gpus-per-task")
        per_node = GpuCount(per_task.gpu_type, per_task.count * (tasks_per_node or 1))
    if gpus is not None:
        total = parse_gpu_count(gpus, "--gpus")
        count = nodes
        if total.count % count:
            raise SbatchError(
                f"--gpus={gpus} does not split evenly over {count} node(s); Isthmus runs "
                "gangs of equal ranks: give --gpus-per-node"
            )
        per_node = GpuCount(total.gpu_type, total.count // count)
    if per_node is None:
        return None, None
    return per_node.count, per_node.gpu_type
