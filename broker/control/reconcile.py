"""The reconciler of one backend: one observe call for all live attempts, facts stored when
they change, derive, transitions through set_state, retries decided and applied.

- "backend unreachable" is kept as a reason on the jobs, never turned into a failure;
- an attempt missing from the backend (queue and accounting) for `lost_grace_s` is LOST;
- Isthmus-named objects with no live attempt (orphans) and objects of cancelled jobs are
  cancelled in the backend;
- one attempt never stops the pass: each is handled in its own guard (broker.control.guard),
  its changes applied in its own savepoint of a transaction shared by a chunk of attempts
  (broker.control.reconcile_apply); an attempt that fails is marked InternalError where its
  state allows and looked at again next pass; an unexpected error of `observe` is the
  backend's, shown on its jobs like an unreachable backend (with the correlation id), never a
  job failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from backends.base import Backend, BackendUnavailable, Observed, Said, said_of
from broker import ledger, metrics
from broker.control.derive import Derived
from broker.control.guard import JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.reconcile_apply import RECONCILER, _ending, apply_all, charge, mark_one
from broker.control.soft_state import Told
from broker.domain import HOLDING, FailureCategory, JobState, Reason, reason_messages
from broker.domain.facts import ENDED_PHASES, Fact, Finding, Phase
from broker.metrics import BACKEND_UP
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import records
from broker.store.queries import get_job, jobs_by_ids
from broker.store.records import JobRecord

__all__ = ["RECONCILER", "ReconcileReport", "charge", "run_reconcile"]


@dataclass
class ReconcileReport:
    observed: int = 0
    transitions: int = 0
    lost: int = 0
    orphans_cancelled: int = 0
    cancelled: int = 0
    unreachable: bool = False


def _cancel(plane: ControlPlane, backend: Backend, a: att.AttemptRecord, grace: int) -> None:
    try:
        result = backend.cancel(a.backend_name, grace)
    except BackendUnavailable:
        return
    log.info("cancel %s: %s", a.backend_name, result.message or "sent")


def _said(facts: Sequence[Fact]) -> dict[str, Said]:
    """What the backend said of each object (backends.base.said_of): kept by an `Observed`
    answer, read off the facts of a plain list."""
    if isinstance(facts, Observed):
        return facts.said
    return {f.backend_name: said_of(f.phase, f.reason, f.message) for f in facts}


def _newest(facts: Sequence[Fact]) -> datetime | None:
    if isinstance(facts, Observed):
        return facts.newest
    return max((f.observed_at for f in facts), default=None)


def _news(brief: list[att.Brief], said: dict[str, Said], told: dict[str, Told],
          now: datetime) -> set[str]:
    """The objects whose waiting message is news against the one last applied (`told`), by
    the rule of waiting reasons (broker.domain.reason_messages: new wording at most once a
    minute, new figures alone once in five; "8 more needed" -> "16 more needed" is not
    rewritten every pass). One not told yet (a restart) is news."""
    out: set[str] = set()
    for b in brief:
        s = said.get(b.backend_name)
        if s is None or not s[2]:
            continue
        kept = told.get(b.backend_name)
        if kept is None or reason_messages.is_news("", kept[0], kept[1], "", s[2], now):
            out.add(b.backend_name)
    return out


def _changed(brief: list[att.Brief], said: dict[str, Said],
             news: set[str]) -> list[att.Brief]:
    """The attempts `_one` would not leave alone: all but the live attempts of jobs not
    cancelled whose stored phase and reason are what the backend says and whose waiting
    message is not news (`_news`), LOST excepted. A few comparisons per attempt: this runs
    over every live attempt on every pass."""
    cancelled, lost = JobState.CANCELLED.value, Phase.LOST.value
    get = said.get
    return [b for b in brief
            if b.job_state is None or b.job_state == cancelled
            or (s := get(b.backend_name)) is None or s[0] == lost
            or s[0] != b.phase or s[1] != b.job_reason
            or b.backend_name in news]


def _told(brief: list[att.Brief], said: dict[str, Said], told: dict[str, Told],
          applied: set[str], now: datetime) -> dict[str, Told]:
    """SoftState.told after a pass that applied the facts of `applied`: their waiting message
    as of `now`, the others' as they were; live attempts only."""
    out: dict[str, Told] = {}
    for b in brief:
        name = b.backend_name
        s = said.get(name)
        if s is None or not s[2]:
            continue
        if name in applied:
            out[name] = (s[2], now)
        elif (kept := told.get(name)) is not None:
            out[name] = kept
    return out


def run_reconcile(plane: ControlPlane, backend_name: str) -> ReconcileReport:
    """One pass. The attempts and jobs are read in narrow columns (one statement); the full
    rows only of the attempts the backend's facts say changed (and of their jobs when
    cancelled: the others' rows are read once, locked by the apply), so a pass over many
    quiet attempts costs little more than the backend's observe call."""
    backend = plane.backends[backend_name]
    report = ReconcileReport()
    now = plane.clock()
    with plane.db.read() as s:
        brief = att.dispatched_brief(s, backend_name)
    with JobGuard("observe", backend_name, subject="backend") as guard:
        try:
            facts = backend.observe([b.backend_name for b in brief])
            BACKEND_UP.labels(backend_name).set(1)
            metrics.LAG.observed(backend_name, now, _newest(facts))
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
    said = _said(facts)
    report.observed = len(facts)
    told = plane.soft.told.get(backend_name, {})
    news = _news(brief, said, told, now)
    todo = _changed(brief, said, news)
    live: list[att.AttemptRecord] = []
    jobs: dict[str, JobRecord] = {}
    if todo:  # a quiet pass reads nothing more
        keys = [(b.job_id, b.number) for b in todo]
        with plane.db.read() as s:
            live = [a for a in att.by_keys(s, keys)  # still live (the read above was earlier)
                    if a.ended_at is None and a.dispatch == att.CREATED]
            # the full rows only of cancelled jobs (their cancel is sent and charged here);
            # the others' state and reason are the brief's, and the apply locks and reads
            # their rows again
            cancelled = [b.job_id for b in todo if b.job_state == JobState.CANCELLED.value]
            jobs = jobs_by_ids(s, cancelled) if cancelled else {}
    fact_of = _fact_of(facts)
    lifecycle = {b.job_id: b for b in todo}
    changed: list[tuple[att.AttemptRecord, Fact]] = []  # applied in chunks below
    for a in live:
        with JobGuard("reconcile", a.job_id) as guard:
            _one(plane, backend, a, lifecycle[a.job_id], jobs.get(a.job_id),
                 fact_of(a.backend_name), now, report, changed, a.backend_name in news)
        if guard.incident is not None:
            mark_one(plane, guard.incident, now)
    report.transitions += apply_all(plane, changed, now)
    # told once written (an exception above leaves it as it was: the next pass decides
    # again); a job the apply failed on is marked InternalError, a reason that differs from
    # the backend's, so the next pass applies its fact again
    plane.soft.told[backend_name] = _told(brief, said, told, {b.backend_name for b in todo},
                                          now)
    live_names = {b.backend_name for b in brief}
    for name, (phase, _, _) in said.items():  # Isthmus objects nobody owns any more
        if name in live_names or phase in _ENDED:
            continue
        fact = fact_of(name)
        if fact is None or not fact.job_id or not fact.attempt:
            continue
        with JobGuard("orphan check", fact.job_id):
            _orphan(plane, backend, backend_name, fact, report)
    return report


_ENDED = frozenset(p.value for p in ENDED_PHASES)


def _fact_of(facts: Sequence[Fact]) -> Callable[[str], Fact | None]:
    """The fact of an object by name: built on demand from an `Observed` answer, looked up in
    a plain list (the last fact of a name, as the backend listed them)."""
    if isinstance(facts, Observed):
        return facts.fact
    return {f.backend_name: f for f in facts}.get


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


def _one(plane: ControlPlane, backend: Backend, a: att.AttemptRecord, b: att.Brief,
         job: JobRecord | None, fact: Fact | None, now: datetime, report: ReconcileReport,
         changed: list[tuple[att.AttemptRecord, Fact]], retold: bool = False) -> None:
    """One live attempt against what the backend said about it (`fact`, None if nothing);
    a fact to apply is added to `changed` (broker.control.reconcile_apply). `b`: its job's
    state and reason as the pass read them; `job`: the job's row, read when it was cancelled
    (None if not, or gone since). `retold`: its waiting message is new (`_news`)."""
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
            # job row first, as set_state and the progress route take it: the attempt row
            # first, then the ledger entries (whose key share on the job row waits for a
            # progress report holding it) deadlocked with that report (it wants the attempt)
            records.lock_job(s, a.job_id)
            att.update(s, a.job_id, a.number, ended_at=end)
            if ended:
                assert fact is not None
                charge(s, plane, job.team, a, _ending(fact, Derived()),
                       end, now, running=fact.started_at, fact=fact, failure=fact.failure,
                       submitted_by=job.submitted_by)
            else:
                charge(s, plane, job.team, a, ledger.Ending.CANCELLED, end, now,
                       submitted_by=job.submitted_by)
        plane.forget_specs([job])  # its attempt has ended: neither is read again
        return
    if fact is None or fact.phase is Phase.LOST:
        # Missing, or reported lost: either may be a moment of inconsistency (a job that
        # left the queue before accounting recorded it), so both wait out the grace.
        missing = a.missing_since or now
        if a.missing_since is None:
            with plane.db.write() as s:
                att.update(s, a.job_id, a.number, missing_since=now)
        if (now - missing).total_seconds() >= plane.params.lost_grace_s:
            lost = fact or Finding(
                phase=Phase.LOST, reason=Reason.Orchestration,
                failure=FailureCategory.ORCHESTRATION,
                message=f"{a.backend_name} is unknown to {backend_name} "
                        "(queue and accounting)",
            ).fact(backend=backend_name, backend_name=a.backend_name, job_id=a.job_id,
                   attempt=a.number, observed_at=now)
            changed.append((a, lost))
            report.lost += 1
        return
    if a.phase == fact.phase.value and b.job_state is not None \
            and b.job_reason == fact.reason.value and not retold:
        return  # nothing new
    changed.append((a, fact))


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
