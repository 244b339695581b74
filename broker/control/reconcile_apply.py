"""Applying what a reconcile pass saw changed (broker.control.reconcile finds it): each
attempt's fact stored, its transitions through set_state, its ending booked in the ledger.

The changed attempts of a pass are applied in chunks of APPLY_CHUNK, one transaction each (one
commit and one fence check per chunk instead of two per attempt), with no savepoint per
attempt: an attempt that fails fails its chunk's transaction, and the chunk is written again
attempt by attempt, each in a transaction of its own under its JobGuard, so the one that fails
is marked InternalError and the others stand. A chunk reads its jobs, decides every attempt's
writes, and only then locks its jobs, in one statement in id order, checking that none changed
since it read them (records.lock_unmoved; if one did, a cancel say, the chunk is rolled back
and written again with its jobs locked first); it applies its attempts in the order of the
quota counters they release; a chunk PostgreSQL aborted as a deadlock victim is written again
(on_conflict) instead of ending the pass. So the chunk holds its jobs' rows only for its
statements and its commit: the ledger entries its attempts look up are read in one statement
(broker.store.ledger_lookups), and its writes that nothing in the chunk reads back (events, job
states, ledger entries, attempt rows) are queued and sent as one executemany per statement at
its end, after the lock (broker.store.batch). The metrics of the chunk's transitions and
endings are counted once it committed (broker.store.batch.deferred with effects=False): a chunk
that fails counts nothing, and the one-by-one writing or the next pass counts each once. The
retry decision of an attempt that ended in a failure or a preemption
(broker.control.requeue.retry) is taken in a savepoint of its own and recorded on the attempt:
the failure, its retry (FAILED -> RETRYING -> QUEUED, or FAILED for good) and the attempt's
ending commit together, so no crash can cut between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlmodel import Session

from broker import ledger, metrics
from broker.control import requeue
from broker.control.derive import Derived, derive
from broker.control.faults import crash_point
from broker.control.guard import SYSTEMIC, Incident, JobGuard, mark
from broker.control.plane import ControlPlane, log
from broker.domain import FailureCategory, JobState, reproducibility
from broker.domain.facts import ENDED_PHASES, Fact, Phase
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import batch, cause_lookups, ledger_lookups, queries, records
from broker.store.conflicts import on_conflict

RECONCILER = "system:reconciler"
APPLY_CHUNK = 200


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
           failure: FailureCategory | None = None, submitted_by: str | None = None) -> bool:
    """Book an ended attempt in the ledger (usage, waste by kind, cost) and count it in the
    metrics. Every path that ends an attempt calls this; the ledger books each attempt once,
    so a second path that sees the same ending adds nothing. False when already booked.
    `submitted_by`: the job's submitter, when the caller holds the job's row (saves a read)."""
    flavor = plane.config.flavor(a.flavor)
    pool = next((p for p in plane.config.pools if p.name == a.pool), None)
    weight = (flavor.cost_weight if flavor else 1.0) * (pool.cost_weight if pool else 1.0)
    held = ledger.Held(
        gpus=a.gpus, since=(a.dispatched_at or a.created_at) if a.dispatch == att.CREATED
        else None, until=end, running=running or a.started_at, progress=a.checkpoint_at,
    )
    r = ledger.Reservation(a.job_id, a.number, team, a.flavor, a.gpus)
    who = (a.pool, submitted_by) if submitted_by is not None else None
    hours = ledger.charge(s, r, held, ending, weight, now, note=f"pool {a.pool}", who=who)
    if not hours:
        return False
    failed = None
    if ending in (ledger.Ending.FAILED, ledger.Ending.LOST):
        category = failure or (fact.failure if fact else None) or FailureCategory.UNKNOWN
        oom = fact is not None and metrics.is_oom(fact)
        failed = (category.value, a.pool, "true" if oom else "false")
    # counted with the booking: inside a reconcile chunk, once the chunk committed
    batch.after(s, lambda: _count_charge(team, a.flavor, a.pool, hours, weight, failed))
    return True


def _count_charge(team: str, flavor: str, pool: str, hours: dict[ledger.LedgerKind, float],
                  weight: float, failed: tuple[str, str, str] | None) -> None:
    metrics.charged(team, flavor, pool, hours, weight)
    if failed is not None:
        metrics.FAILURES.labels(*failed).inc()


def _new_fact(a: att.AttemptRecord, fact: Fact) -> att.NewFact:
    return att.NewFact(fact.backend, fact.backend_name, a.job_id, a.number, fact.phase.value,
                       fact.reason.value, fact.observed_at, fact.model_dump_json())


def _derived(a: att.AttemptRecord, fact: Fact, job: records.JobRecord) -> tuple[Fact, Derived]:
    """The fact as the lifecycle reads it and what it implies for the attempt's job."""
    fact = _as_preempted(a, fact)
    current = job.attempt == a.number
    return fact, derive(JobState(job.state) if current else JobState.QUEUED, fact)


def _cause_keys(ref: str, d: Derived, state: str) -> list[str | None]:
    """The cause key of each of `d`'s steps (None: a reason only, which may repeat)."""
    return [f"{ref}:{i}" if step.state.value != state else None for i, step in enumerate(d.steps)]


def _as_preempted(a: att.AttemptRecord, fact: Fact) -> Fact:
    """The fact as the lifecycle reads it: an attempt Isthmus set out to preempt
    (preempt.mark_intents) whose object then ended other than successfully ended by that
    preemption, whatever the backend calls the ending (the ranks' exit on the stop signal, a
    cancel): the process that signalled it died before it could record the preemption. The
    fact itself is stored as the backend said it."""
    if (a.preempt_signalled_at is None or fact.phase not in ENDED_PHASES
            or fact.phase in (Phase.SUCCEEDED, Phase.PREEMPTED)):
        return fact
    return fact.model_copy(update={
        "phase": Phase.PREEMPTED, "failure": None,
        "message": f"preempted (its stop was signalled; the backend reported "
                   f"{fact.phase.value}: {fact.message or fact.raw_state or 'no detail'})"})


def _resolve_once(s: Session, plane: ControlPlane, a: att.AttemptRecord, fact: Fact,
                  now: datetime) -> None:
    """What the run actually ran with, beside its immutable snapshot; written by the first
    observation of the started gang and never again (the reader of an old attempt must get
    what it was)."""
    snapshot = plane.snapshot(a, last=True)
    resolved = reproducibility.resolve(snapshot, fact, now)
    att.set_resolved_once(s, a.job_id, a.number, resolved.model_dump_json())


def _apply_in(s: Session, plane: ControlPlane, a: att.AttemptRecord, now: datetime,
              job: records.JobRecord, ref: str, derived: tuple[Fact, Derived]) -> int:
    """One attempt's fact, transitions, ending and retry decision, in the caller's transaction,
    every write queued (the caller locks the job before they are sent, or held it locked
    before): the transitions made. The attempt's row is written once, last. `ref`: the fact as
    the caller stored it; `derived`: `_derived` of it."""
    fact, d = derived
    keys = _cause_keys(ref, d, job.state)
    row: dict[str, object] = {"phase": fact.phase.value, "last_seen_at": now,
                              "missing_since": None}
    moved = 0
    for step, key in zip(d.steps, keys, strict=True):
        r = set_state(s, a.job_id, step.state, step.reason,
                      Cause("reconciler", RECONCILER, key=key, facts_ref=ref),
                      step.message, now=now, locked=job)
        moved += r.accepted
    if d.started and a.started_at is None:
        row["started_at"] = fact.started_at or now
    if a.resolved_json is None and (d.started or fact.phase is Phase.RUNNING):
        _resolve_once(s, plane, a, fact, now)
    if d.ended:
        end = fact.ended_at or now
        failure = d.failure.value if d.failure else None
        row.update(ended_at=end, failure=failure, preempted=d.preempted)
        charge(s, plane, job.team, a, _ending(fact, d), end, now,
               running=fact.started_at or a.started_at, fact=fact, failure=d.failure,
               submitted_by=job.submitted_by)
        if d.failure is not None or d.preempted:
            decided: str | None = requeue.NONE
            if _asks_retry(a, job, d):
                ended = replace(a, ended_at=end, failure=failure, preempted=d.preempted)
                decided = _decide_retry(s, plane, job, ended, d, fact.bad_nodes, now)
            row["retry_decision"] = decided
    att.update_queued(s, a.job_id, a.number, **row)
    return moved


def _asks_retry(a: att.AttemptRecord, job: records.JobRecord, d: Derived) -> bool:
    """Whether the attempt's ending goes to the retry engine (`_decide_retry`): it ended in a
    failure or a preemption, and it is its job's current attempt."""
    return d.ended and (d.failure is not None or d.preempted) and job.attempt == a.number


def _decide_retry(s: Session, plane: ControlPlane, job: records.JobRecord,
                  ended: att.AttemptRecord, d: Derived, blamed: tuple[str, ...],
                  now: datetime) -> str | None:
    """The retry decision of the attempt `ended`, applied in a savepoint of its own: one that
    cannot be taken (the job's stored spec no longer parses, say) leaves the failure itself
    recorded and the decision undone and None (undecided: the leader's repair,
    requeue.repair_undecided, asks again, and its guard shows the error on the job)."""
    queued = batch.pending(s)
    mark = queued.mark() if queued is not None else None
    before = replace(job)
    with JobGuard("retry decision", job.id) as guard, s.begin_nested():
        return requeue.retry(s, plane, job, ended, preempted=d.preempted, failure=d.failure,
                             now=now, blamed=blamed, locked=True)
    assert guard.incident is not None
    if queued is not None and mark is not None:
        queued.cut(mark)
    for name in records.JobRecord.__slots__:
        setattr(job, name, getattr(before, name))
    return None


def apply_all(plane: ControlPlane, changed: list[tuple[att.AttemptRecord, Fact]],
              now: datetime) -> int:
    """Apply the facts of the changed attempts, a chunk per transaction; the number of
    transitions made."""
    moved = 0
    for start in range(0, len(changed), APPLY_CHUNK):
        moved += _apply_chunk(plane, changed[start:start + APPLY_CHUNK], now)
    return moved


@dataclass
class _Written:
    moved: int = 0
    incidents: list[Incident] = field(default_factory=list)


def _apply_chunk(plane: ControlPlane, chunk: list[tuple[att.AttemptRecord, Fact]],
                 now: datetime) -> int:
    if len({a.job_id for a, _ in chunk}) < len(chunk):  # never from a pass (_write_locked)
        out = _written_one_by_one(plane, chunk, now, "two attempts of one job")
    else:
        try:
            out = _write_chunk(plane, chunk, now)
        except SYSTEMIC:
            raise
        except Exception as exc:  # a per-job failure at the chunk's commit
            out = _written_one_by_one(plane, chunk, now, type(exc).__name__)
    for incident in out.incidents:
        mark_one(plane, incident, now)
    return out.moved


def _written_one_by_one(plane: ControlPlane, chunk: list[tuple[att.AttemptRecord, Fact]],
                        now: datetime, why: str) -> _Written:
    """The chunk again, an attempt per transaction, each under its job's guard: what failed
    at the chunk's commit (the quota counters are written there, outside every attempt's
    savepoint: a counter that drifted below what one team's release gives back breaks its
    CHECK) fails alone and is shown on its job; the others' ends are recorded."""
    log.warning("reconcile: chunk of %d not written whole (%s); writing its attempts one by "
                "one", len(chunk), why)
    out = _Written()
    for item in chunk:
        with JobGuard("reconcile", item[0].job_id) as guard:
            one = _write_chunk(plane, [item], now)
        if guard.incident is not None:
            out.incidents.append(guard.incident)
            continue
        out.moved += one.moved
        out.incidents += one.incidents
    return out


def _write_chunk(plane: ControlPlane, chunk: list[tuple[att.AttemptRecord, Fact]],
                 now: datetime) -> _Written:
    """The chunk's transaction, its jobs read without a lock and locked only once its writes
    are decided (`records.lock_unmoved`, just before they are sent): a cancel or a progress
    report on one of its jobs waits for the chunk's statements and commit, not for the Python
    that decides them. If a job changed in between (a cancel committed first, say), that
    transaction is rolled back and the chunk written again, its jobs locked first."""
    return records.with_late_locks(
        lambda lock_first: _written(plane, chunk, now, lock_first=lock_first))


@on_conflict  # a deadlock victim's chunk is written again: its aborted transaction left nothing
def _written(plane: ControlPlane, chunk: list[tuple[att.AttemptRecord, Fact]],
             now: datetime, *, lock_first: bool) -> _Written:
    """The chunk's transaction: its jobs read (`lock_first`: locked, in one statement in id
    order, as every multi-row lock here is; else read without a lock and locked in one
    statement once every write is queued), then each attempt, in the order of the quota
    counter its ending releases (team, flavor): the counters' row locks are taken in the order
    the admission's batch takes them (broker.store.batch.additive), not in job order (in job
    order a reconcile chunk and an admission chunk deadlocked on two counters under the soak)."""
    out = _Written()
    crash_point("before-fact-persist")
    ids = [a.job_id for a, _ in chunk]
    with plane.db.write() as s:
        jobs = records.lock_jobs(s, ids) if lock_first else queries.jobs_by_ids(s, ids)
        seen = {job.id: job.last_seq for job in jobs.values()}
        keys = {(a.job_id, a.number) for a, _ in chunk} | {(j.id, j.attempt)
                                                          for j in jobs.values()}
        with ledger_lookups.read_ahead(s, sorted(keys)), \
                batch.deferred(s, effects=False) as effects:
            _write_locked(s, plane, chunk, now, jobs, effects, out)
            if not lock_first:
                records.lock_unmoved(s, seen)  # before the queued writes are sent
    effects.run_effects()  # metrics of the chunk's transitions and endings, once committed
    plane.forget_specs(jobs.values())  # the jobs it ended are not read again
    return out


def _write_locked(s: Session, plane: ControlPlane, chunk: list[tuple[att.AttemptRecord, Fact]],
                  now: datetime, locked: dict[str, records.JobRecord], effects: batch.Deferred,
                  out: _Written) -> None:
    """The chunk's attempts, from its jobs as read (`locked`: locked, or to be locked before
    the writes are sent), their writes queued; any failure is the chunk's (raised: the caller
    writes the attempts again one by one, each alone).

    Each job is met once: a pass's attempts are the live dispatched ones of one read
    (att.dispatched_brief), each once, and a job never has two live attempts: its next one is
    made only by an admission from QUEUED, every way into QUEUED ends the attempt first (here,
    preempt.end_locked, requeue.requeue_refused) and nothing clears an ended_at. So what an
    attempt's savepoint rolled back (its queued writes cut, the ledger entries it taught
    ledger_lookups) is never read again in the chunk. A chunk that would meet a job twice is
    written attempt by attempt instead (_apply_chunk)."""
    del effects  # the chunk's queued writes and metrics: undone whole with it

    def counter(item: tuple[att.AttemptRecord, Fact]) -> tuple[str, str, str]:
        a, job = item[0], locked.get(item[0].job_id)
        return (job.team if job else "", a.flavor, a.job_id)

    # the facts stored in one statement, in the order they are applied (the ids one insert
    # each gave them); their transitions' causes name those new facts, so none was applied
    # before: set_state need not ask (cause_lookups.fresh)
    items = [(a, fact, job) for a, fact in sorted(chunk, key=counter)
             if (job := locked.get(a.job_id)) is not None]
    refs = [f"fact:{fid}" for fid in att.insert_facts(s, [_new_fact(a, f) for a, f, _ in items])]
    derived = [_derived(a, fact, job) for a, fact, job in items]
    causes = [(a.job_id, key) for (a, _, job), ref, (_, d) in zip(items, refs, derived, strict=True)
              for key in _cause_keys(ref, d, job.state) if key]
    # the retry decisions' keys (`retry:<n>`, ...: not new, a repair may have applied one)
    # read at once, not one look-up per transition
    retrying = [(a.job_id, f"{kind}:{a.number}")
                for (a, _, job), (_, d) in zip(items, derived, strict=True)
                if _asks_retry(a, job, d) for kind in requeue.CAUSE_KINDS]
    with cause_lookups.fresh(s, causes, read=retrying):
        for (a, _, job), ref, seen in zip(items, refs, derived, strict=True):
            # no savepoint per attempt (one each cost a tenth of the pass): an attempt that
            # fails fails the chunk's transaction, and _apply_chunk writes the chunk again
            # attempt by attempt, each in a transaction of its own under its job's guard
            out.moved += _apply_in(s, plane, a, now, job, ref, seen)


def mark_one(plane: ControlPlane, incident: Incident, now: datetime) -> None:
    with JobGuard("marking", incident.job_id), plane.db.write() as s:
        mark(s, incident, RECONCILER, now)
