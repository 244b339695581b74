"""The reconciler of one backend: one observe call for all live attempts, facts stored when
they change, derive, transitions through set_state, retries decided and applied.

- "backend unreachable" is kept as a reason on the jobs, never turned into a failure;
- an attempt missing from the backend (queue and accounting) for `lost_grace_s` is LOST;
- Isthmus-named objects with no live attempt (orphans) and objects of cancelled jobs are
  cancelled in the backend;
- one attempt never stops the pass: each is handled in its own guard (broker.control.guard),
  an attempt that fails is marked InternalError where its state allows and looked at again
  next pass; an unexpected error of `observe` is the backend's, shown on its jobs like an
  unreachable backend (with the correlation id), never a job failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from backends.base import Backend, BackendUnavailable
from broker import ledger, metrics
from broker.control import requeue
from broker.control.derive import Derived, derive
from broker.control.faults import crash_point
from broker.control.guard import Incident, JobGuard, mark
from broker.control.plane import ControlPlane, log
from broker.domain import HOLDING, FailureCategory, JobState, Reason, reproducibility
from broker.domain.attempts import RunSnapshot
from broker.domain.facts import ENDED_PHASES, Fact, Phase
from broker.metrics import BACKEND_UP
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store.queries import get_job, jobs_by_ids
from broker.store.records import JobRecord

RECONCILER = "system:reconciler"


@dataclass
class ReconcileReport:
    observed: int = 0
    transitions: int = 0
    lost: int = 0
    orphans_cancelled: int = 0
    cancelled: int = 0
    unreachable: bool = False


def _store_fact(plane: ControlPlane, a: att.AttemptRecord, fact: Fact, now: datetime) -> str:
    with plane.db.write() as s:
        fid = att.insert_fact(
            s, fact.backend, fact.backend_name, a.job_id, a.number, fact.phase.value,
            fact.reason.value, fact.observed_at, fact.model_dump_json(),
        )
        att.update(s, a.job_id, a.number, phase=fact.phase.value, last_seen_at=now,
                   missing_since=None)
    return f"fact:{fid}"


def _resolve_once(s: Session, a: att.AttemptRecord, fact: Fact, now: datetime) -> None:
    """What the run actually ran with, beside its immutable snapshot; written by the first
    observation of the started gang and never again (the reader of an old attempt must get
    what it was)."""
    snapshot = RunSnapshot.model_validate_json(a.snapshot_json)
    resolved = reproducibility.resolve(snapshot, fact, now)
    att.set_resolved_once(s, a.job_id, a.number, resolved.model_dump_json())


def _apply(plane: ControlPlane, a: att.AttemptRecord, fact: Fact, now: datetime) -> int:
    with plane.db.read() as s:
        job = get_job(s, a.job_id)
    if job is None:
        return 0
    state = JobState(job.state)
    current = job.attempt == a.number
    d = derive(state if current else JobState.QUEUED, fact)
    crash_point("before-fact-persist")
    ref = _store_fact(plane, a, fact, now)
    moved = 0
    with plane.db.write() as s:
        for i, step in enumerate(d.steps):
            key = f"{ref}:{i}" if step.state is not JobState(job.state) else None
            r = set_state(s, a.job_id, step.state, step.reason,
                          Cause("reconciler", RECONCILER, key=key, facts_ref=ref),
                          step.message, now=now)
            moved += r.accepted
        if d.started and a.started_at is None:
            att.update(s, a.job_id, a.number, started_at=fact.started_at or now)
        if a.resolved_json is None and (d.started or fact.phase is Phase.RUNNING):
            _resolve_once(s, a, fact, now)
        if d.ended:
            end = fact.ended_at or now
            att.update(s, a.job_id, a.number, ended_at=end,
                       failure=d.failure.value if d.failure else None, preempted=d.preempted)
            _account(s, plane, job.team, a, fact, d, end, now)
    if current and (d.failure is not None or d.preempted):
        requeue.requeue_after(plane, a.job_id, a, preempted=d.preempted, failure=d.failure, now=now,
                      blamed=fact.bad_nodes)
    return moved


def _ending(fact: Fact, d: Derived) -> ledger.Ending:
    """The accounting ending of an attempt the backend reports ended."""
    if d.preempted or fact.phase is Phase.PREEMPTED:
        return ledger.Ending.PREEMPTED
    if fact.phase is Phase.LOST:
        return ledger.Ending.LOST
    if d.failure is not None or fact.phase is Phase.FAILED:
        return ledger.Ending.FAILED
    if fact.phase is Phase.CANCELLED:
        return ledger.Ending.CANCELLED
    return ledger.Ending.SUCCEEDED


def charge(s: Session, plane: ControlPlane, team: str, a: att.AttemptRecord,
           ending: ledger.Ending, end: datetime, now: datetime,
           running: datetime | None = None, fact: Fact | None = None,
           failure: FailureCategory | None = None) -> bool:
    """Book an ended attempt in the ledger (usage, waste by kind, cost) and count it in the
    metrics. Every path that ends an attempt calls this; the ledger books each attempt once,
    so a second path that sees the same ending adds nothing. False when already booked."""
    flavor = plane.config.flavor(a.flavor)
    pool = next((p for p in plane.config.pools if p.name == a.pool), None)
    weight = (flavor.cost_weight if flavor else 1.0) * (pool.cost_weight if pool else 1.0)
    held = ledger.Held(
        gpus=a.gpus, since=(a.dispatched_at or a.created_at) if a.dispatch == att.CREATED
        else None, until=end, running=running or a.started_at, progress=a.checkpoint_at,
    )
    r = ledger.Reservation(a.job_id, a.number, team, a.flavor, a.gpus)
    hours = ledger.charge(s, r, held, ending, weight, now, note=f"pool {a.pool}")
    if not hours:
        return False
    metrics.charged(team, a.flavor, a.pool, hours, weight)
    if ending in (ledger.Ending.FAILED, ledger.Ending.LOST):
        category = failure or (fact.failure if fact else None) or FailureCategory.UNKNOWN
        oom = fact is not None and metrics.is_oom(fact)
        metrics.FAILURES.labels(category.value, a.pool, "true" if oom else "false").inc()
    return True


def _account(s: Session, plane: ControlPlane, team: str, a: att.AttemptRecord, fact: Fact,
             d: Derived, end: datetime, now: datetime) -> None:
    """Usage and waste of an attempt the backend reports ended (see broker.ledger)."""
    charge(s, plane, team, a, _ending(fact, d), end, now,
           running=fact.started_at or a.started_at, fact=fact, failure=d.failure)


def _cancel(plane: ControlPlane, backend: Backend, a: att.AttemptRecord, grace: int) -> None:
    try:
        result = backend.cancel(a.backend_name, grace)
    except BackendUnavailable:
        return
    log.info("cancel %s: %s", a.backend_name, result.message or "sent")


def _unchanged(b: att.Brief, fact: Fact | None) -> bool:
    """What `_one` would leave alone: the backend says what was stored (phase and reason) of
    a live attempt of a job that is not cancelled."""
    return (fact is not None and fact.phase is not Phase.LOST and b.job_state is not None
            and b.job_state != JobState.CANCELLED and b.phase == fact.phase.value
            and b.job_reason == fact.reason.value)


def reconcile(plane: ControlPlane, backend_name: str) -> ReconcileReport:
    """One pass. The attempts and jobs are read in narrow columns (one statement); the full
    rows only of those the backend's facts say changed, so a pass over many quiet attempts
    costs little more than the backend's observe call."""
    backend = plane.backends[backend_name]
    report = ReconcileReport()
    now = plane.clock()
    with plane.db.read() as s:
        brief = att.dispatched_brief(s, backend_name)
    with JobGuard("observe", backend_name, subject="backend") as guard:
        try:
            facts = backend.observe([b.backend_name for b in brief])
            BACKEND_UP.labels(backend_name).set(1)
            metrics.LAG.observed(backend_name, now, facts)
        except BackendUnavailable as exc:
            metrics.LAG.failed(backend_name, now)
            _unreachable(plane, backend_name, brief, f"{backend_name}: {exc}", now)
            report.unreachable = True
            return report
    if guard.incident is not None:
        metrics.LAG.failed(backend_name, now)
        why = f"{backend_name}: {guard.incident.message}"
        _unreachable(plane, backend_name, brief, why, now)
        report.unreachable = True
        return report
    by_name = {f.backend_name: f for f in facts}
    report.observed = len(facts)
    live_names = {b.backend_name for b in brief}
    todo = [(b.job_id, b.number) for b in brief if not _unchanged(b, by_name.get(b.backend_name))]
    with plane.db.read() as s:
        live = [a for a in att.by_keys(s, todo)  # still live (the read above was earlier)
                if a.ended_at is None and a.dispatch == att.CREATED]
        jobs: dict[str, JobRecord | None] = dict(jobs_by_ids(s, [a.job_id for a in live]))
    for a in live:
        with JobGuard("reconcile", a.job_id) as guard:
            _one(plane, backend, a, jobs.get(a.job_id), by_name.get(a.backend_name), now,
                 report)
        if guard.incident is not None:
            _mark(plane, guard.incident, now)
    for fact in facts:  # Isthmus objects nobody owns any more
        if fact.backend_name in live_names or fact.phase in ENDED_PHASES:
            continue
        if not fact.job_id or not fact.attempt:
            continue
        with JobGuard("orphan check", fact.job_id):
            _orphan(plane, backend, backend_name, fact, report)
    return report


def _unreachable(plane: ControlPlane, backend_name: str, brief: list[att.Brief], why: str,
                 now: datetime) -> None:
    """Nothing is known about the backend's objects: a reason on each job, never a failure."""
    BACKEND_UP.labels(backend_name).set(0)
    with plane.db.write() as s:
        for b in brief:
            if (b.job_state is not None and JobState(b.job_state) in HOLDING
                    and b.job_attempt == b.number):
                set_state(s, b.job_id, JobState(b.job_state), Reason.BackendUnavailable,
                          Cause("reconciler", RECONCILER), why, now=now)


def _mark(plane: ControlPlane, incident: Incident, now: datetime) -> None:
    with JobGuard("marking", incident.job_id), plane.db.write() as s:
        mark(s, incident, RECONCILER, now)


def _one(plane: ControlPlane, backend: Backend, a: att.AttemptRecord, job: JobRecord | None,
         fact: Fact | None, now: datetime, report: ReconcileReport) -> None:
    """One live attempt against what the backend said about it (`fact`, None if nothing)."""
    backend_name = a.backend
    if job is not None and job.state == JobState.CANCELLED:
        # a preempted object is still sent the cancel
        if fact is None or fact.phase not in ENDED_PHASES - {Phase.PREEMPTED}:
            spec = plane.spec(job.id, job.spec_json)
            grace = plane.params.cancel_grace_s
            _cancel(plane, backend, a, spec.checkpoint.grace if grace is None else grace)
            report.cancelled += 1
        # GPUs held up to now (the cancel just sent), or up to the end the backend reported
        # when the attempt ended on its own first.
        ended = fact is not None and fact.phase in ENDED_PHASES
        end = (fact.ended_at if fact is not None and ended else None) or now
        with plane.db.write() as s:
            att.update(s, a.job_id, a.number, ended_at=end)
            if ended:
                assert fact is not None
                charge(s, plane, job.team, a, _ending(fact, Derived()),
                       end, now, running=fact.started_at, fact=fact, failure=fact.failure)
            else:
                charge(s, plane, job.team, a, ledger.Ending.CANCELLED, end, now)
        return
    if fact is None or fact.phase is Phase.LOST:
        # Missing, or reported lost: either may be a moment of inconsistency (a job that
        # left the queue before accounting recorded it), so both wait out the grace.
        missing = a.missing_since or now
        if a.missing_since is None:
            with plane.db.write() as s:
                att.update(s, a.job_id, a.number, missing_since=now)
        if (now - missing).total_seconds() >= plane.params.lost_grace_s:
            lost = fact or Fact(
                backend=backend_name, backend_name=a.backend_name, job_id=a.job_id,
                attempt=a.number, phase=Phase.LOST, reason=Reason.Orchestration,
                failure=FailureCategory.ORCHESTRATION, observed_at=now,
                message=f"{a.backend_name} is unknown to {backend_name} "
                        "(queue and accounting)",
            )
            report.transitions += _apply(plane, a, lost, now)
            report.lost += 1
        return
    if a.phase == fact.phase.value and job is not None and job.reason == fact.reason.value:
        return  # nothing new
    report.transitions += _apply(plane, a, fact, now)


def _orphan(plane: ControlPlane, backend: Backend, backend_name: str, fact: Fact,
            report: ReconcileReport) -> None:
    assert fact.job_id and fact.attempt
    with plane.db.read() as s:
        if get_job(s, fact.job_id) is None:
            # Not a job of this installation (another Isthmus may share the backend):
            # never touch what we cannot prove is ours.
            return
        owner = att.get_attempt(s, fact.job_id, fact.attempt)
    if owner is None or owner.ended_at is not None:
        try:
            backend.cancel(fact.backend_name, 0)
            report.orphans_cancelled += 1
            log.warning("cancelled orphan %s on %s", fact.backend_name, backend_name)
        except BackendUnavailable:
            pass
