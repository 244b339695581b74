"""isqueue: squeue for Isthmus jobs (the caller's team; all teams for admins).

Default columns ``JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)``; ``-o`` takes
squeue's common ``%`` fields, ``-O`` their long names; ``--start`` shows the expected start
(Isthmus has no estimate yet: N/A), ``--json`` the jobs as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from broker.hpc import jobview
from broker.hpc.common import all_jobs, connect, main_guard
from broker.hpc.jobview import JobView

PROG = "isqueue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R"
FIELDS = {  # % letter -> (header, long name)
    "i": ("JOBID", "JobID"), "A": ("JOBID", "JobID"), "P": ("PARTITION", "Partition"),
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


def value(job: JobView, letter: str, now: datetime) -> str:
    if letter in ("i", "A"):
        return job.display_id
    if letter == "P":
        return job.partition
    if letter == "j":
        return job.name
    if letter == "u":
        return job.user
    if letter == "t":
        return job.code
    if letter == "T":
        return job.long_state
    if letter == "M":
        return jobview.duration(job.elapsed_s(now))
    if letter == "l":
        return jobview.duration(job.time_limit_s)
    if letter == "D":
        return str(job.num_nodes)
    if letter == "C":
        return str(job.cpus)
    if letter == "N":
        return jobview.compress(job.nodes)
    if letter == "R":
        if job.state == "RUNNING" and job.nodes:
            return jobview.compress(job.nodes)
        return f"({job.reason})"
    if letter == "r":
        return job.reason
    if letter == "a":
        return job.account
    if letter == "q":
        return job.qos
    if letter == "S":  # squeue: the start, or a pending job's expected start
        at = job.start or (job.estimated_start if job.long_state == "PENDING" else None)
        return jobview.timestamp(at) if at else "N/A"
    if letter == "V":
        return jobview.timestamp(job.submitted)
    if letter == "b":
        return f"gres/gpu:{job.gpus_per_node}"
    raise ValueError(letter)


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
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--help", action="help")
    return p


def _split(text: str | None) -> set[str] | None:
    return {t for t in text.split(",") if t} if text else None


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)

    def body() -> int:
        now = datetime.now(UTC)
        states = _states(args.states) if args.states else None
        if args.start:
            states = {"PENDING"}
        users, parts = _split(args.user), _split(args.partition)
        ids, names, accounts = _split(args.jobs), _split(args.name), _split(args.account)
        with connect(environ) as api:
            if args.me:
                users = {api.whoami()["name"]}
            wire_states = None if states and not states <= {"PENDING", "RUNNING"} else list(
                jobview.ACTIVE_STATES)
            jobs = []
            for job in all_jobs(api, states=wire_states):
                if states is None and job.state not in jobview.ACTIVE_STATES:
                    continue
                if states is not None and job.long_state not in states:
                    continue
                if users and job.user not in users:
                    continue
                if parts and not parts & set(job.partition.split(",")):
                    continue
                if ids and not any(job.matches_id(i) for i in ids):
                    continue
                if names and job.name not in names:
                    continue
                if accounts and job.account not in accounts:
                    continue
                jobs.append(job)
        jobs.reverse()  # oldest first, as squeue lists by priority/submission
        if args.json:
            print(json.dumps({"jobs": [_as_json(j, now) for j in jobs]}, indent=2))
            return 0
        fmt = args.format or (_long_format(args.long_format) if args.long_format else None)
        fmt = fmt or (START_FORMAT if args.start else DEFAULT_FORMAT)
        for line in render(jobs, fmt, now, header=not args.noheader):
            print(line)
        return 0

    return main_guard(PROG, body)


def _as_json(job: JobView, now: datetime) -> dict[str, object]:
    return {
        "job_id": job.display_id, "isthmus_id": job.id, "name": job.name, "user_name": job.user,
        "account": job.account, "partition": job.partition, "job_state": job.long_state,
        "state_reason": job.reason, "nodes": jobview.compress(job.nodes),
        "node_count": job.num_nodes, "gpus_per_node": job.gpus_per_node,
        "time_limit_s": job.time_limit_s, "elapsed_s": job.elapsed_s(now),
        "submit_time": jobview.timestamp(job.submitted),
        "start_time": jobview.timestamp(job.start) if job.start else None,
        "estimated_start": (jobview.timestamp(job.estimated_start)
                            if job.estimated_start else None),
        "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
    }


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))
