"""Holds before admission: a start time, dependencies, an array's running-task limit. Pure.

``hold(job, others, now)`` answers None (the job may go to admission) or a Hold with its reason.
Checks, in order: an approval its priority class needs and it lacks (AwaitingApproval); the
start time (BeginTimeNotReached); the dependencies (WaitingForDependency,
or ``never`` with DependencyNeverSatisfied when one cannot be satisfied any more); the array's
limit (JobArrayTaskLimit: as many tasks of the array hold GPUs as its %N allows).

Dependency kinds, as sbatch(1) defines them, over Isthmus states (FAILED is final for users):
after: every job has started or ended; afterany: every job has ended; afterok: every job
SUCCEEDED (never, once one ends otherwise); afternotok: every job ended otherwise than
SUCCEEDED (never, once one succeeds); singleton: no earlier job with the same name and user is
still active. A job that does not exist, or belongs to another team, can never satisfy one, and
the two read the same (no message tells another team's job apart from no job, nor shows its
state); singleton and array limits count only the job's own team's jobs, so another team's jobs
that carry the same name or array id hold nothing back.
With ``any_dependency`` one satisfied dependency is enough and all must fail for ``never``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from broker.domain.reasons import Reason
from broker.domain.scheduling import Dependency, Scheduling
from broker.domain.states import HOLDING, TERMINAL

NOT_STARTED = frozenset({"SUBMITTED", "VALIDATING", "QUEUED", "ADMITTED", "PREPARING"})


@dataclass(frozen=True, slots=True)
class JobRef:
    """What a hold needs to know about another job."""

    id: str
    state: str
    name: str
    user: str
    created_at: datetime
    array_id: str | None = None
    team: str = ""


@dataclass(frozen=True, slots=True)
class Held:
    """The job to decide on."""

    id: str
    name: str
    user: str
    created_at: datetime
    scheduling: Scheduling
    team: str = ""
    awaiting_approval: str | None = None
    """The job's priority class, when it needs an admin's approval the job does not have."""


@dataclass(frozen=True, slots=True)
class Hold:
    reason: Reason
    message: str
    never: bool = False  # the job can never run: cancel it


def _one(dep: Dependency, job: Held, by_id: Mapping[str, JobRef],
         active: Sequence[JobRef]) -> tuple[bool | None, str]:
    """(True: satisfied, False: never, None: not yet) and what it waits for."""
    if dep.kind == "singleton":
        ahead = [o.id for o in active if o.name == job.name and o.user == job.user
                 and o.team == job.team and o.id != job.id
                 and (o.created_at, o.id) < (job.created_at, job.id)]
        return (None, f"singleton: {', '.join(ahead)} still active") if ahead else (True, "")
    waiting = []
    for ref in dep.jobs:
        other = by_id.get(ref)
        if other is None or other.team != job.team:
            return False, f"{dep.kind}: job {ref} does not exist in team {job.team}"
        st = other.state
        if dep.kind == "after":
            ok = None if st in NOT_STARTED else True
        elif st not in TERMINAL:
            ok = None
        elif dep.kind == "afterany":
            ok = True
        elif dep.kind == "afterok":
            ok = st == "SUCCEEDED"
        else:  # afternotok
            ok = st != "SUCCEEDED"
        if ok is False:
            return False, f"{dep.kind}: job {ref} ended {st}"
        if ok is None:
            waiting.append(f"{ref} ({st})")
    if waiting:
        return None, f"{dep.kind}: waiting for {', '.join(waiting)}"
    return True, ""


def hold(job: Held, by_id: Mapping[str, JobRef], active: Sequence[JobRef],
         now: datetime) -> Hold | None:
    """Why ``job`` may not go to admission now, or None. ``by_id`` holds the jobs its
    dependencies name; ``active`` every job that has not ended (for singleton and arrays)."""
    if job.awaiting_approval is not None:
        return Hold(Reason.AwaitingApproval,
                    f"priority class '{job.awaiting_approval}' needs an admin's approval "
                    f"(isthmus admin approve {job.id}, or refuse)")
    sched = job.scheduling
    if sched.begin_at is not None and now < sched.begin_at:
        return Hold(Reason.BeginTimeNotReached,
                    f"begins at {sched.begin_at.isoformat()} (--begin)")
    if sched.dependencies:
        results = [_one(d, job, by_id, active) for d in sched.dependencies]
        oks = [ok for ok, _ in results]
        notes = "; ".join(msg for _, msg in results if msg)
        if sched.any_dependency:
            satisfied, never = any(ok is True for ok in oks), all(ok is False for ok in oks)
        else:
            satisfied, never = all(ok is True for ok in oks), any(ok is False for ok in oks)
        if never:
            return Hold(Reason.DependencyNeverSatisfied, notes, never=True)
        if not satisfied:
            return Hold(Reason.WaitingForDependency, notes)
    array = sched.array
    if array is not None and array.limit is not None:
        running = sum(1 for o in active if o.array_id == array.id and o.team == job.team
                      and o.state in HOLDING)
        if running >= array.limit:
            return Hold(Reason.JobArrayTaskLimit,
                        f"array {array.id}: {running} of at most {array.limit} tasks run")
    return None


def holds_for(jobs: Sequence[Held], by_id: Mapping[str, JobRef], active: Sequence[JobRef],
              now: datetime) -> dict[str, Hold]:
    """``hold`` for every queued job of a cycle. An array's free slots (limit minus tasks
    holding GPUs) go to its lowest indices; the other ready tasks wait with JobArrayTaskLimit, so
    one cycle never admits more tasks than the limit allows."""
    out: dict[str, Hold] = {}
    slots: dict[str, int] = {}
    order = sorted(jobs, key=lambda j: (j.scheduling.array.index if j.scheduling.array else 0,
                                        j.created_at, j.id))
    for job in order:
        got = hold(job, by_id, active, now)
        if got is not None:
            out[job.id] = got
            continue
        array = job.scheduling.array
        if array is None or array.limit is None:
            continue
        if array.id not in slots:
            running = sum(1 for o in active if o.array_id == array.id
                          and o.team == job.team and o.state in HOLDING)
            slots[array.id] = array.limit - running
        if slots[array.id] <= 0:
            out[job.id] = Hold(Reason.JobArrayTaskLimit,
                               f"array {array.id}: tasks ahead use its limit of {array.limit}")
        slots[array.id] -= 1
    return out
