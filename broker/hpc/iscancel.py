"""iscancel: scancel for Isthmus jobs.

Ids (Isthmus ids, or ``ARRAYID_TASK`` / ``ARRAYID`` for arrays) and the filters ``-u``, ``-n``,
``-t``, ``-p``, ``-A`` select jobs; with filters only, every matching job of the caller's team is
cancelled. Another team's job is answered as scancel answers an unknown id: the broker does not
tell whether it exists. ``-s/--signal=SIG`` sends the signal instead of cancelling, as scancel
does: on Slurm to the job's steps (``scancel --signal``); a job on Kubernetes cannot be signalled
(the broker answers why) and a job that is not running neither.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from broker.client import ApiError, Client
from broker.hpc import jobview
from broker.hpc.common import all_jobs, connect, main_guard

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
    p.add_argument("--me", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    sig = None
    if args.signal:
        sig = signal_name(args.signal)
        if sig is None:
            print(f"{PROG}: error: Invalid job signal: {args.signal}", file=sys.stderr)
            return 1
    filters = any((args.user, args.name, args.state, args.partition, args.account, args.me))
    if not args.job_ids and not filters:
        print(f"{PROG}: error: No job identification provided", file=sys.stderr)
        return 1

    def body() -> int:
        code = 0
        with connect(environ) as api:
            direct = [i for i in args.job_ids if "_" not in i and len(i) == 16 and not filters]
            if direct and len(direct) == len(args.job_ids):
                for job_id in direct:
                    code |= _cancel(api, job_id, job_id, args.verbose, sig)
                return code
            users = {api.whoami()["name"]} if args.me else _split(args.user)
            states = {jobview.CODES.get(s, s) for s in (_split(args.state.upper())
                                                         if args.state else set())}
            found = []
            for job in all_jobs(api, states=list(jobview.ACTIVE_STATES)):
                if args.job_ids and not any(job.matches_id(i) for i in args.job_ids):
                    continue
                if users and job.user not in users:
                    continue
                if args.name and job.name not in _split(args.name):
                    continue
                if states and job.long_state not in states:
                    continue
                if args.partition and not _split(args.partition) & set(job.partition.split(",")):
                    continue
                if args.account and job.account not in _split(args.account):
                    continue
                found.append(job)
            for wanted in args.job_ids:
                if not any(j.matches_id(wanted) for j in found):
                    print(f"{PROG}: error: Kill job error on job id {wanted}: "
                          "Invalid job id specified", file=sys.stderr)
                    code = 1
            for job in found:
                code |= _cancel(api, job.id, job.display_id, args.verbose, sig)
        return code

    return main_guard(PROG, body)


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


def _cancel(api: Client, job_id: str, shown: str, verbose: bool, sig: str | None = None) -> int:
    try:
        if sig is not None:
            api.signal(job_id, sig)
        else:
            api.cancel(job_id)
    except ApiError as exc:
        if sig is not None and exc.status in (409, 503):
            print(f"{PROG}: error: Signal {sig} to job {shown} not sent: {exc}",
                  file=sys.stderr)
        elif exc.status == 404:
            print(f"{PROG}: error: Kill job error on job id {shown}: Invalid job id specified",
                  file=sys.stderr)
        elif exc.status == 409:
            print(f"{PROG}: error: Kill job error on job id {shown}: Job/step already "
                  "completing or completed", file=sys.stderr)
        else:
            print(f"{PROG}: error: Kill job error on job id {shown}: {exc}", file=sys.stderr)
        return 1
    if verbose:
        what = f"Signal {sig} to" if sig is not None else "Terminating"
        print(f"{PROG}: {what} job {shown}", file=sys.stderr)
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))
