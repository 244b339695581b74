"""isacct: sacct for Isthmus jobs (the caller's team; all teams for admins).

States and exit codes come from the lifecycle and the backend's facts (see ``jobview``); the
extra field ``FailureCategory`` is Isthmus's failure category (UserError, InfraTransient, ...).
Isthmus keeps no job steps, so ``-X`` changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from broker.domain import slurm_time
from broker.dropins import jobview, pipes
from broker.dropins.common import all_jobs, connect, main_guard
from broker.dropins.jobview import JobView

PROG = "isacct"
DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
WIDTHS = {"jobid": 20, "jobname": 10, "start": 19, "end": 19, "submit": 19, "alloctres": 30,
          "nodelist": 15, "failurecategory": 15, "reason": 20}


def field(job: JobView, name: str, now: datetime) -> str:
    key = name.partition("%")[0].lower()  # sacct's Field%WIDTH
    tres = (f"cpu={job.cpus},gres/gpu={job.gpus_per_node * job.num_nodes},"
            f"node={job.num_nodes}")
    values = {
        "jobid": job.display_id, "jobidraw": job.raw_id, "isthmusid": job.id,
        "jobname": job.name, "reqtres": tres, "comment": "",
        "partition": job.partition, "account": job.account, "user": job.user,
        "alloccpus": str(job.cpus), "allocnodes": str(job.num_nodes),
        "alloctres": tres,
        "state": job.accounted_state, "exitcode": job.exit_text,
        "elapsed": slurm_time.long_form(job.elapsed_s(now)),
        "timelimit": slurm_time.long_form(job.time_limit_s),
        "start": jobview.timestamp(job.start), "end": jobview.timestamp(job.end),
        "submit": jobview.timestamp(job.submitted), "nodelist": jobview.compress(job.nodes)
        or "None assigned", "nnodes": str(job.num_nodes), "qos": job.qos,
        "reason": job.reason, "failurecategory": job.failure or "",
    }
    if key not in values:
        raise SystemExit(f"{PROG}: error: Invalid field requested: \"{name}\"")
    return values[key]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="sacct for Isthmus jobs")
    p.add_argument("-j", "--jobs")
    p.add_argument("-u", "--user")
    p.add_argument("-A", "--accounts")
    p.add_argument("-S", "--starttime")
    p.add_argument("-E", "--endtime")
    p.add_argument("-s", "--state")
    p.add_argument("--name", help="comma list of job names")
    p.add_argument("-M", "--clusters", help="accepted; Isthmus is one federation")
    p.add_argument("-L", "--allclusters", action="store_true", help="accepted, as --clusters")
    p.add_argument("-X", "--allocations", action="store_true")
    p.add_argument("-o", "--format", default=DEFAULT_FIELDS)
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("--json", action="store_true")
    return p


def _when(text: str | None, default: datetime | None) -> datetime | None:
    if not text:
        return default
    if text.lower() == "now":
        return datetime.now(UTC)
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise SystemExit(f"{PROG}: error: Invalid time specification: {text}")


@dataclass(frozen=True)
class _Selection:
    """Which jobs to account for; empty sets and None bounds select all."""

    ids: list[str]
    names: set[str]
    users: set[str]
    accounts: set[str]
    states: set[str]
    start: datetime | None
    end: datetime | None
    now: datetime

    @classmethod
    def of(cls, args: argparse.Namespace, now: datetime) -> _Selection:
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(
            # sacct's default window: since midnight, unless jobs are named.
            start=_when(args.starttime, None if args.jobs else midnight),
            end=_when(args.endtime, None),
            states={jobview.CODES.get(s, s) for s in (args.state or "").upper().split(",") if s},
            ids=[i for i in (args.jobs or "").split(",") if i],
            names={n for n in (args.name or "").split(",") if n},
            users={u for u in (args.user or "").split(",") if u},
            accounts={a for a in (args.accounts or "").split(",") if a},
            now=now,
        )

    def keeps(self, job: JobView) -> bool:
        if self.ids and not any(job.matches_id(i) for i in self.ids):
            return False
        if self.names and job.name not in self.names:
            return False
        if self.users and job.user not in self.users:
            return False
        if self.accounts and job.account not in self.accounts:
            return False
        if self.states and job.long_state not in self.states:
            return False
        if self.start and (job.end or self.now) < self.start:
            return False
        return not (self.end and job.submitted > self.end)


def _print_parsable(table: list[list[str]], names: list[str], args: argparse.Namespace) -> None:
    end_mark = "|" if args.parsable else ""
    if not args.noheader:
        print("|".join(n.partition("%")[0] for n in names) + end_mark)
    for r in table:
        print("|".join(r) + end_mark)


def _width(name: str) -> int:
    """A column's width: sacct's Field%WIDTH (bounded), else the field's default."""
    key, _, size = name.partition("%")
    if size.isdigit():
        return max(1, min(int(size), 1024))
    return WIDTHS.get(key.lower(), 10)


def _print_columns(table: list[list[str]], names: list[str], args: argparse.Namespace) -> None:
    widths = [_width(n) for n in names]
    if not args.noheader:
        print(" ".join(n.partition("%")[0][:w].rjust(w)
                       for n, w in zip(names, widths, strict=True)))
        print(" ".join("-" * w for w in widths))
    for r in table:
        print(" ".join(_fit(v, w).rjust(w) for v, w in zip(r, widths, strict=True)))


def _fit(value: str, width: int) -> str:
    """sacct's cut: a value longer than its column ends in '+' (``CANCELLED+``)."""
    return value if len(value) <= width else value[:width - 1] + "+"


def _print_jobs(rows: list[JobView], names: list[str], args: argparse.Namespace,
                now: datetime) -> None:
    if args.json:
        out = [{n: field(j, n, now) for n in [*names, "JobIDRaw", "IsthmusID", "FailureCategory"]}
               for j in rows]
        print(json.dumps({"jobs": out}, indent=2))
        return
    table = [[field(j, n, now) for n in names] for j in rows]
    if args.parsable2 or args.parsable:
        _print_parsable(table, names, args)
    else:
        _print_columns(table, names, args)


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    now = datetime.now(UTC)
    selection = _Selection.of(args, now)
    names = [f for f in args.format.split(",") if f]

    def body() -> int:
        with connect(environ) as api:
            rows = [job for job in all_jobs(api) if selection.keeps(job)]
        rows = jobview.oldest_first(rows)
        _print_jobs(rows, names, args, now)
        return 0

    return main_guard(PROG, body)


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
