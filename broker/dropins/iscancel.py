"""iscancel: scancel for Isthmus jobs.

Ids (job numbers, ``ARRAYID_TASK`` / ``ARRAYID`` for arrays, or Isthmus ids) and the filters
``-u``, ``-n``, ``-t``, ``-p``, ``-A`` select jobs; with filters only, every matching job of the
caller's team is cancelled. Another team's job is answered as scancel answers an unknown id: the
broker does not tell whether it exists. ``-s/--signal=SIG`` sends the signal instead of
cancelling, as scancel does: on Slurm to the job's steps (``scancel --signal``), with ``-b``
to its batch shell only and with ``-f`` to both; a job on
Kubernetes cannot be signalled (the broker answers why) and a job that is not running neither.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.client import ApiError, Client
from broker.dropins import jobview, pipes
from broker.dropins.common import all_jobs, connect, main_guard
from broker.dropins.jobview import JobView

PROG = "iscancel"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="scancel for Isthmus jobs")
    p.add_argument("job_ids", nargs="*")
    p.add_argument("-u", "--user")
    p.add_argument("-n", "--name", "--jobname", dest="name")
    p.add_argument("-t", "--state")
    p.add_argument("-p", "--partition")
    p.add_argument("-A", "--account")
    p.add_argument("-s", "--signal")
    whom = p.add_mutually_exclusive_group()
    whom.add_argument("-b", "--batch", action="store_true",
                      help="with --signal: to the batch shell only")
    whom.add_argument("-f", "--full", action="store_true",
                      help="with --signal: to the batch shell and every step")
    p.add_argument("--me", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    name = signal_name(args.signal) if args.signal else None
    sig = None if name is None else Signal(
        name, "batch" if args.batch else "full" if args.full else "steps")
    filters = any((args.user, args.name, args.state, args.partition, args.account, args.me))
    error = _usage_error(args, sig, filters)
    if error is not None:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    return main_guard(PROG, lambda: _cancel_selected(environ, args, sig, filters))


@dataclass(frozen=True)
class Signal:
    """A signal to send instead of a cancel, and to whom (scancel's default: the steps;
    ``-b``: the batch shell; ``-f``: both); shown as its name."""

    name: str
    whom: str

    def __str__(self) -> str:
        return self.name


def _usage_error(args: argparse.Namespace, sig: Signal | None, filters: bool) -> str | None:
    if args.signal and sig is None:
        return f"Invalid job signal: {args.signal}"
    if not args.job_ids and not filters:
        return "No job identification provided"
    return None


def _cancel_selected(environ: Mapping[str, str], args: argparse.Namespace, sig: Signal | None,
                     filters: bool) -> int:
    code = 0
    with connect(environ) as api:
        direct = [i for i in args.job_ids if "_" not in i and len(i) == 16 and not filters]
        if direct and len(direct) == len(args.job_ids):
            # An Isthmus id is cancelled in one call; an id the broker does not know as a job
            # may be an array id (the same shape), looked up among the listed jobs below.
            rest = []
            for job_id in direct:
                done = _direct(api, job_id, args.verbose, sig)
                if done is None:
                    rest.append(job_id)
                else:
                    code |= done
            if not rest:
                return code
            args.job_ids = rest
        found = _matching(api, args)
        code |= _report_unmatched(args.job_ids, found)
        for job in found:
            code |= _cancel(api, job.id, job.display_id, args.verbose, sig)
    return code


def _direct(api: Client, job_id: str, verbose: bool, sig: Signal | None) -> int | None:
    """Cancel (or signal) one job by its Isthmus id: the exit code, or None when the broker
    knows no job by that id (it may be an array id)."""
    try:
        _send(api, job_id, sig)
    except ApiError as exc:
        return None if exc.status == 404 else _refused(exc, job_id, sig)
    return _done(job_id, verbose, sig)


def _matching(api: Client, args: argparse.Namespace) -> list[JobView]:
    """The active jobs the ids and filters select."""
    users = {api.whoami()["name"]} if args.me else _split(args.user)
    states = {jobview.CODES.get(s, s) for s in (_split(args.state.upper())
                                                 if args.state else set())}
    return [job for job in all_jobs(api, states=list(jobview.ACTIVE_STATES))
            if _keeps(job, args, users, states)]


def _keeps(job: JobView, args: argparse.Namespace, users: set[str], states: set[str]) -> bool:
    if args.job_ids and not any(job.matches_id(i) for i in args.job_ids):
        return False
    if users and job.user not in users:
        return False
    if args.name and job.name not in _split(args.name):
        return False
    if states and job.long_state not in states:
        return False
    if args.partition and not _split(args.partition) & set(job.partition.split(",")):
        return False
    return not (args.account and job.account not in _split(args.account))


def _report_unmatched(job_ids: Sequence[str], found: Sequence[JobView]) -> int:
    """Slurm's error for each id that selects no job; 1 when there was one."""
    code = 0
    for wanted in job_ids:
        if not any(j.matches_id(wanted) for j in found):
            print(f"{PROG}: error: Kill job error on job id {wanted}: "
                  "Invalid job id specified", file=sys.stderr)
            code = 1
    return code


def _split(text: str | None) -> set[str]:
    return {t for t in (text or "").split(",") if t}


def signal_name(text: str) -> str | None:
    """scancel's signal argument (a name with or without SIG, or a number) as a name without
    SIG; None when it is no signal."""
    import signal

    raw = text.strip().upper()
    try:
        found = signal.Signals(int(raw)) if raw.isdigit() else signal.Signals[
            raw if raw.startswith("SIG") else f"SIG{raw}"]
    except (KeyError, ValueError):
        return None
    return found.name.removeprefix("SIG")


def _cancel(api: Client, job_id: str, shown: str, verbose: bool,
            sig: Signal | None = None) -> int:
    try:
        _send(api, job_id, sig)
    except ApiError as exc:
        return _refused(exc, shown, sig)
    return _done(shown, verbose, sig)


def _send(api: Client, job_id: str, sig: Signal | None) -> None:
    if sig is not None:
        api.signal(job_id, sig.name, sig.whom)
    else:
        api.cancel(job_id)


def _refused(exc: ApiError, shown: str, sig: Signal | None) -> int:
    """scancel's message for a refused cancel or signal; exit code 1."""
    if sig is not None and exc.status in (409, 503):
        print(f"{PROG}: error: Signal {sig} to job {shown} not sent: {exc}", file=sys.stderr)
    elif exc.status == 404:
        print(f"{PROG}: error: Kill job error on job id {shown}: Invalid job id specified",
              file=sys.stderr)
    elif exc.status == 409:
        print(f"{PROG}: error: Kill job error on job id {shown}: Job/step already "
              "completing or completed", file=sys.stderr)
    else:
        print(f"{PROG}: error: Kill job error on job id {shown}: {exc}", file=sys.stderr)
    return 1


def _done(shown: str, verbose: bool, sig: Signal | None) -> int:
    if verbose:
        what = f"Signal {sig} to" if sig is not None else "Terminating"
        print(f"{PROG}: {what} job {shown}", file=sys.stderr)
    return 0


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
