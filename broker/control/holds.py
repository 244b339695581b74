"""The hold phase of an admission cycle: queued jobs a user holds (scontrol hold), or whose
missing approval, start time, dependencies or array limit keep them back, get their reason and
take no part in placement (policies.holds decides the last three).

A job whose dependency can never be satisfied is cancelled with DependencyNeverSatisfied, as
Slurm does with kill_invalid_depend. Jobs without ``scheduling`` cost nothing here, unless
their priority class needs approval (one look-up of their decision events).
"""

from __future__ import annotations

from datetime import datetime

from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane
from broker.domain import JobState
from broker.domain.reasons import Reason
from broker.domain.scheduling import Scheduling
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.orchestration.user_holds import held_message
from broker.store import approvals
from broker.store.queries import jobs_by_ids, list_jobs
from broker.store.records import JobRecord
from policies.holds import Held, JobRef, holds_for

HOLDS = "system:admission-holds"
ACTIVE = [s.value for s in JobState if s.value not in
          ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")]


def _ref(plane: ControlPlane, job: JobRecord) -> JobRef:
    array_id = None
    with JobGuard("hold view", job.id):
        sched = plane.spec(job.id, job.spec_json).scheduling
        array_id = sched.array.id if sched and sched.array else None
    return JobRef(job.id, job.state, job.name, job.submitted_by, job.created_at, array_id,
                  job.team)


def _unapproved(plane: ControlPlane, queued: list[JobRecord]) -> dict[str, str]:
    """Queued jobs whose priority class needs an approval they do not have -> the class.
    Only jobs of such classes are looked up (their decision events, broker.store.approvals)."""
    needing = {pc.name for pc in plane.config.priority_classes if pc.approval == "required"}
    if not needing:
        return {}
    asking = {j.id: j.priority for j in queued if j.priority in needing}
    if not asking:
        return {}
    with plane.db.read() as s:
        done = approvals.approved(s, sorted(asking))
    return {job_id: pc for job_id, pc in asking.items() if job_id not in done}


def _user_held(plane: ControlPlane, queued: list[JobRecord], by_user: dict[str, str],
               now: datetime) -> list[JobRecord]:
    """The queued jobs no user holds (scontrol hold; `by_user`: job id -> who holds it, read
    with the cycle's inputs); a held one keeps JobHeldUser (set by the hold itself; said again
    here if a job is held without it)."""
    if not by_user:
        return queued
    stale = [j for j in queued if j.id in by_user and j.reason != Reason.JobHeldUser.value]
    if stale:
        with plane.db.write() as s:
            for job in stale:
                with JobGuard("hold", job.id), s.begin_nested():
                    set_state(s, job.id, JobState.QUEUED, Reason.JobHeldUser,
                              Cause("admission", HOLDS), held_message(by_user[job.id]),
                              now=now)
    return [j for j in queued if j.id not in by_user]


def apply_holds(plane: ControlPlane, queued: list[JobRecord], by_user: dict[str, str],
                now: datetime) -> list[JobRecord]:
    """The queued jobs free to go to admission; the others are given their hold reason."""
    queued = _user_held(plane, queued, by_user, now)
    unapproved = _unapproved(plane, queued)
    held: list[Held] = []
    for j in queued:
        with JobGuard("hold view", j.id):
            sched = plane.spec(j.id, j.spec_json).scheduling
            if sched is not None or j.id in unapproved:
                held.append(Held(j.id, j.name, j.submitted_by, j.created_at,
                                 sched or Scheduling(), j.team, unapproved.get(j.id)))
    if not held:
        return queued
    wanted = {ref for h in held for d in h.scheduling.dependencies for ref in d.jobs}
    scheduled = any(h.awaiting_approval is None for h in held)
    with plane.db.read() as s:
        named = jobs_by_ids(s, sorted(wanted)) if wanted else {}
        live = list_jobs(s, states=ACTIVE, limit=100_000, ascending=True) if scheduled else []
    by_id = {k: _ref(plane, v) for k, v in named.items()}
    active = [_ref(plane, j) for j in live]
    verdicts = holds_for(held, by_id, active, now)
    by_job = {j.id: j for j in queued}
    with plane.db.write() as s:
        for job_id, h in verdicts.items():
            job = by_job[job_id]
            with JobGuard("hold", job_id), s.begin_nested():
                if h.never:
                    set_state(s, job_id, JobState.CANCELLED, Reason.DependencyNeverSatisfied,
                              Cause("admission", HOLDS), h.message, now=now)
                elif job.reason != h.reason.value or job.message != h.message:
                    set_state(s, job_id, JobState.QUEUED, h.reason, Cause("admission", HOLDS),
                              h.message, now=now)
    return [j for j in queued if j.id not in verdicts]
