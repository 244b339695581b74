"""iscontrol: the part of scontrol that tools use on jobs: ``show job ID`` (and ``show jobid``)
in Slurm's ``Key=Value`` form (``-o`` puts each job on one line), ``hold ID`` /
``release ID`` for pending jobs and ``requeue ID`` / ``requeuehold ID`` for admitted or running
ones (stopped and put back in the queue under the same id; requeuehold also holds it).

ID is a number, ``ARRAY_TASK``, an array's id (each of its tasks, as scontrol shows them) or an
Isthmus id. Other subcommands are refused by name.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from broker.client import ApiError
from broker.domain import slurm_time
from broker.dropins import jobview, pipes
from broker.dropins.common import DropInError, all_jobs, connect, main_guard
from broker.dropins.jobview import JobView

PROG = "iscontrol"


def _user(name: str) -> str:
    """UserId as scontrol writes it, name(uid); the uid of the same name here, if any."""
    return f"{name}({jobview.uid_of(name)})"


def record(job: JobView, now: datetime) -> list[list[str]]:
    """The lines of ``scontrol show job`` for one job, each a list of Key=Value words."""
    running = job.long_state == "RUNNING"
    lines = [
        [f"JobId={job.raw_id}", f"JobName={job.name}"],
        [f"UserId={_user(job.user)}", f"Account={job.account}", f"QOS={job.qos}"],
        [f"JobState={job.long_state}", f"Reason={'None' if running else job.reason}"],
        [f"RunTime={slurm_time.long_form(job.elapsed_s(now))}",
         f"TimeLimit={slurm_time.long_form(job.time_limit_s)}"],
        [f"SubmitTime={jobview.timestamp(job.submitted)}",
         f"StartTime={jobview.timestamp(job.start)}", f"EndTime={jobview.timestamp(job.end)}"],
        [f"Partition={job.partition}"],
        [f"NodeList={jobview.compress(job.nodes) or '(null)'}"],
        [f"NumNodes={job.num_nodes}", f"NumCPUs={job.cpus}",
         f"TRES=cpu={job.cpus},gres/gpu={job.gpus_per_node * job.num_nodes},"
         f"node={job.num_nodes}"],
        [f"ExitCode={job.exit_text}"],
        [f"StdErr={jobview.expand_path(job.stderr or job.stdout, job)}"],
        [f"StdOut={jobview.expand_path(job.stdout, job)}"],
    ]
    if job.array_job_id is not None and job.array_task_id is not None:
        lines[0][1:1] = [f"ArrayJobId={job.array_job_id}", f"ArrayTaskId={job.array_task_id}"]
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="scontrol show job for Isthmus jobs")
    p.add_argument("-o", "--oneliner", action="store_true")
    p.add_argument("words", nargs="*", help="show job ID")
    return p


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)

    def body() -> int:
        verb = args.words[0].lower() if args.words else ""
        if verb in _CHANGES and len(args.words) >= 2:
            return _change(environ, verb, args.words[1:])
        words = [w.lower() for w in args.words[:2]]
        if words not in (["show", "job"], ["show", "jobid"]) or len(args.words) != 3:
            raise DropInError(f"'{' '.join(args.words)}': only 'show job ID', 'hold ID', "
                              "'release ID', 'requeue ID' and 'requeuehold ID' are available")
        wanted = args.words[2]
        now = datetime.now(UTC)
        with connect(environ) as api:
            jobs = [j for j in all_jobs(api) if j.matches_id(wanted)]
        if not jobs:
            raise DropInError("Invalid job id specified")
        for job in reversed(jobs):  # oldest (the array's first task) first
            lines = record(job, now)
            if args.oneliner:
                print(" ".join(w for line in lines for w in line))
            else:
                print("\n".join(("   " if i else "") + " ".join(line)
                                for i, line in enumerate(lines)))
                print()
        return 0

    return main_guard(PROG, body)


_CHANGES = ("hold", "release", "requeue", "requeuehold")


def _change(environ: Mapping[str, str], verb: str, ids: Sequence[str]) -> int:
    """``scontrol hold|release|requeue|requeuehold ID[,ID...] [ID...]``: each job, by number,
    array id (every task) or Isthmus id; Slurm's words for an id no job of the team has and
    for a job in the wrong state (the broker's reason in brackets)."""
    if "=" in ids[0] or ids[0].lower() == "incomplete":  # caller gives >= 1 word
        raise DropInError(f"'{ids[0]}': scontrol {verb}'s options are not available here; "
                          "name the job ids only")
    wanted = [i for word in ids for i in word.split(",") if i]
    code = 0
    with connect(environ) as api:
        jobs = all_jobs(api)
        for ref in wanted:
            found = [j for j in jobs if j.matches_id(ref)]
            if not found:
                print(f"{PROG}: error: Invalid job id specified for job {ref}", file=sys.stderr)
                code = 1
            for job in found:
                try:
                    if verb == "hold":
                        api.hold(job.id)
                    elif verb == "release":
                        api.release(job.id)
                    else:
                        api.requeue(job.id, hold=verb == "requeuehold")
                except ApiError as exc:
                    print(f"{PROG}: error: {_refusal(verb, job)} for job {job.display_id} "
                          f"({exc})", file=sys.stderr)
                    code = 1
    return code


def _refusal(verb: str, job: JobView) -> str:
    """Slurm's words for a job in a state the change does not apply to."""
    if verb in ("hold", "release"):
        return "Job is no longer pending execution"
    if job.long_state in ("PENDING", "REQUEUED", "REQUEUE_HOLD"):
        return "Job is pending execution"
    return "Job/step already completing or completed"


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
