"""isqueue: squeue for Isthmus jobs (the caller's team; all teams for admins).

Default columns ``JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)``, JOBID being the
job's number (``ARRAY_TASK`` for an array task; an array's waiting tasks share one line
``ARRAY_[0-5%2]`` unless ``-r``); ``-o`` takes squeue's common ``%`` fields, ``-O`` their long
names; ``--start`` shows the expected start
(Isthmus has no estimate yet: N/A) and, after squeue's columns, the window the start is likely
in with its stated coverage (LIKELY_START, broker.domain.start_window), ``--json`` the jobs as
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from broker.domain import slurm_time
from broker.dropins import jobview, pipes
from broker.dropins.common import DropInError, all_jobs, connect, main_guard
from broker.dropins.jobview import JobView

PROG = "isqueue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R"
FIELDS = {  # % letter -> (header, long name)
    "i": ("JOBID", "JobID"), "A": ("JOBID", "JobIDRaw"), "F": ("ARRAY_JOB_ID", "ArrayJobID"),
    "K": ("ARRAY_TASK_ID", "ArrayTaskID"), "P": ("PARTITION", "Partition"),
    "j": ("NAME", "Name"), "u": ("USER", "UserName"), "t": ("ST", "StateCompact"),
    "T": ("STATE", "State"), "M": ("TIME", "TimeUsed"), "l": ("TIME_LIMIT", "TimeLimit"),
    "D": ("NODES", "NumNodes"), "N": ("NODELIST", "NodeList"),
    "R": ("NODELIST(REASON)", "ReasonList"),
    "r": ("REASON", "Reason"), "a": ("ACCOUNT", "Account"), "q": ("QOS", "QOS"),
    "S": ("START_TIME", "StartTime"), "V": ("SUBMIT_TIME", "SubmitTime"),
    "b": ("TRES_PER_NODE", "tres-per-node"), "C": ("CPUS", "NumCPUs"),
}
LONG = {long.lower(): letter for letter, (_h, long) in FIELDS.items()}
LONG["jobid"] = "i"
_SPEC = re.compile(r"%(\.)?(-)?(\d+)?([A-Za-z])")


def _reason_list(job: JobView, _now: datetime) -> str:
    """squeue's %R: a running job's nodes, otherwise its reason in parentheses."""
    if job.state == "RUNNING" and job.nodes:
        return jobview.compress(job.nodes)
    return f"({job.reason})"


def _start_time(job: JobView, _now: datetime) -> str:
    """squeue's %S: the start, or a pending job's expected start."""
    at = job.start or (job.estimated_start if job.long_state == "PENDING" else None)
    return jobview.timestamp(at) if at else "N/A"


_VALUES: dict[str, Callable[[JobView, datetime], str]] = {  # % letter -> the field's text
    "i": lambda job, _now: job.display_id, "A": lambda job, _now: job.raw_id,
    "F": lambda job, _now: job.array_job_id or job.raw_id,
    "K": lambda job, _now: (job.pending_tasks or str(job.array_task_id)
                            if job.array_job_id is not None else "N/A"),
    "P": lambda job, _now: job.partition, "j": lambda job, _now: job.name,
    "u": lambda job, _now: job.user, "t": lambda job, _now: job.code,
    "T": lambda job, _now: job.long_state,
    "M": lambda job, now: slurm_time.short_form(job.elapsed_s(now)),
    "l": lambda job, _now: slurm_time.short_form(job.time_limit_s),
    "D": lambda job, _now: str(job.num_nodes), "C": lambda job, _now: str(job.cpus),
    "N": lambda job, _now: jobview.compress(job.nodes), "R": _reason_list,
    "r": lambda job, _now: job.reason, "a": lambda job, _now: job.account,
    "q": lambda job, _now: job.qos, "S": _start_time,
    "V": lambda job, _now: jobview.timestamp(job.submitted),
    "b": lambda job, _now: f"gres/gpu:{job.gpus_per_node}",
}


def value(job: JobView, letter: str, now: datetime) -> str:
    get = _VALUES.get(letter)
    if get is None:
        raise ValueError(letter)
    return get(job, now)


def render(jobs: Sequence[JobView], fmt: str, now: datetime, header: bool) -> list[str]:
    specs = list(_SPEC.finditer(fmt))
    lines = []
    rows: list[Sequence[str] | None] = [None, *[[value(j, m.group(4), now) for m in specs]
                                                  for j in jobs]]
    for row in rows if header else rows[1:]:
        out, pos = [], 0
        for i, m in enumerate(specs):
            out.append(fmt[pos:m.start()])
            pos = m.end()
            text = FIELDS[m.group(4)][0] if row is None else row[i]
            width = int(m.group(3)) if m.group(3) else 0
            if m.group(1) and width:
                text = text[:width]
            text = text.ljust(width) if m.group(2) or not m.group(1) else text.rjust(width)
            out.append(text)
        out.append(fmt[pos:])
        lines.append("".join(out).rstrip())
    return lines


def _long_format(spec: str) -> str:
    parts = []
    for item in spec.split(","):
        name, _, size = item.partition(":")
        letter = LONG.get(name.strip().lower())
        if letter is None:
            raise SystemExit(f"{PROG}: error: Invalid job format specification: {name}")
        parts.append(f"%{'.' if size else ''}{size or 20}{letter}")
    return " ".join(parts)


def _states(text: str) -> set[str]:
    out = set()
    for item in text.upper().split(","):
        if item == "ALL":
            return set(jobview.NAMES)
        name = jobview.CODES.get(item, item)
        if name not in jobview.NAMES:
            raise SystemExit(f"{PROG}: error: Invalid job state specified: {item}")
        out.add(name)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="squeue for Isthmus jobs", add_help=False)
    p.add_argument("-u", "--user", help="comma list of users")
    p.add_argument("--me", action="store_true", help="your own jobs")
    p.add_argument("-p", "--partition", help="comma list of partitions")
    p.add_argument("-t", "--states", help="comma list of states (PD,R,CD,F,CA or names, all)")
    p.add_argument("-j", "--jobs", help="comma list of job ids")
    p.add_argument("-n", "--name", help="comma list of job names")
    p.add_argument("-A", "--account", help="comma list of accounts (teams)")
    p.add_argument("-o", "--format", help="squeue %% fields, e.g. '%%.18i %%.2t %%R'")
    p.add_argument("-O", "--Format", dest="long_format", help="long field names, e.g. JobID,State")
    p.add_argument("--start", action="store_true", help="pending jobs and their expected start")
    p.add_argument("-r", "--array", action="store_true",
                   help="one line per array task (else an array's pending tasks share one)")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--help", action="help")
    return p


def _split(text: str | None) -> set[str] | None:
    return {t for t in text.split(",") if t} if text else None


@dataclass(frozen=True)
class _Selection:
    """Which jobs to list: ``states`` None means the active ones; empty sets select all."""

    states: set[str] | None
    users: set[str] | None
    parts: set[str] | None
    ids: set[str] | None
    names: set[str] | None
    accounts: set[str] | None

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Selection:
        states = _states(args.states) if args.states else None
        if args.start:
            states = {"PENDING"}
        return cls(states=states, users=_split(args.user), parts=_split(args.partition),
                   ids=_split(args.jobs), names=_split(args.name), accounts=_split(args.account))

    def wire_states(self) -> list[str] | None:
        """The states to ask the broker for: the active ones unless others are wanted."""
        if self.states and not self.states <= {"PENDING", "RUNNING"}:
            return None
        return list(jobview.ACTIVE_STATES)

    def keeps(self, job: JobView) -> bool:
        if self.states is None and job.state not in jobview.ACTIVE_STATES:
            return False
        if self.states is not None and job.long_state not in self.states:
            return False
        if self.users and job.user not in self.users:
            return False
        if self.parts and not self.parts & set(job.partition.split(",")):
            return False
        if self.ids and not any(job.matches_id(i) for i in self.ids):
            return False
        if self.names and job.name not in self.names:
            return False
        return not (self.accounts and job.account not in self.accounts)


def _print_jobs(jobs: Sequence[JobView], args: argparse.Namespace, now: datetime) -> None:
    if args.json:
        print(json.dumps({"jobs": [_as_json(j, now) for j in jobs]}, indent=2))
        return
    fmt = args.format or (_long_format(args.long_format) if args.long_format else None)
    fmt = fmt or (START_FORMAT if args.start else DEFAULT_FORMAT)
    lines = render(jobs, fmt, now, header=not args.noheader)
    if args.start and fmt == START_FORMAT:  # squeue's columns first: scripts cut them
        width = max((len(x) for x in lines), default=0)
        likely = [job.start_window or "" for job in jobs]
        column = ["LIKELY_START", *likely] if not args.noheader else likely
        lines = [f"{x.ljust(width)}  {w}".rstrip() for x, w in zip(lines, column, strict=True)]
    for line in lines:
        print(line)


def check_format(fmt: str | None) -> None:
    """Refuse a ``-o`` format with a field letter squeue does not know, before asking the broker
    (squeue: ``Invalid job format specification: Z``)."""
    for match in _SPEC.finditer(fmt or ""):
        if match.group(4) not in _VALUES:
            raise DropInError(f"Invalid job format specification: {match.group(4)}")


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)

    def body() -> int:
        check_format(args.format)
        now = datetime.now(UTC)
        selection = _Selection.of(args)
        with connect(environ) as api:
            if args.me:
                selection = replace(selection, users={api.whoami()["name"]})
            jobs = [job for job in all_jobs(api, states=selection.wire_states())
                    if selection.keeps(job)]
        jobs = jobview.oldest_first(jobs)  # as squeue lists by priority/submission
        if not args.array and not args.json:
            jobs = jobview.collapse_pending(jobs)
        _print_jobs(jobs, args, now)
        return 0

    return main_guard(PROG, body)


def _as_json(job: JobView, now: datetime) -> dict[str, object]:
    return {
        "job_id": job.display_id, "job_number": job.number, "isthmus_id": job.id,
        "name": job.name, "user_name": job.user,
        "account": job.account, "partition": job.partition, "job_state": job.long_state,
        "state_reason": job.reason, "nodes": jobview.compress(job.nodes),
        "node_count": job.num_nodes, "gpus_per_node": job.gpus_per_node,
        "time_limit_s": job.time_limit_s, "elapsed_s": job.elapsed_s(now),
        "submit_time": jobview.timestamp(job.submitted),
        "start_time": jobview.timestamp(job.start) if job.start else None,
        "estimated_start": (jobview.timestamp(job.estimated_start)
                            if job.estimated_start else None),
        "start_window": job.start_window,
        "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
    }


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
