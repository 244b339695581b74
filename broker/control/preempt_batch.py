"""All the victims of one admission cycle stopped together: one read, their backend signals,
one write transaction.

Stopped one by one, each victim cost three transactions (a read, the stop, the requeue), each
waiting its turn for row locks the reconciler and the progress route hold: under the 50/s
soak a cycle with 5-11 victims took 20-40 s, and no job was admitted meanwhile. Here the
cycle's victims are read in one transaction, signalled, then in one write transaction their
jobs are locked in id order (records.lock_jobs), their attempts read again under those locks
(job rows before attempt rows, the order of set_state, the reconciler and the progress route),
and each is ended, charged and requeued (preempt.end_locked). The quota counters are written
at the commit (broker.store.quota_counters); the metrics are counted once it committed.

A batch aborted as a deadlock victim is written again (on_conflict); a batch that still
fails, or fails for any other reason, is done again victim by victim (preempt.preempt, each
guarded and marked alone), so one bad victim never keeps the others from being stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from broker.control import requeue
from broker.control.guard import SYSTEMIC, Incident, JobGuard
from broker.control.plane import ControlPlane, log
from broker.control.preempt import end_locked, mark_intents, preempt, signal_victim
from broker.domain import HOLDING
from broker.store import attempts as att
from broker.store import batch, cause_lookups, ledger_lookups, records
from broker.store.conflicts import conflict, on_conflict
from broker.store.queries import jobs_by_ids
from policies.preemption import Victim

BATCH = True
"""Stop a cycle's victims in one transaction (False: one by one, the fallback; switchable
for a comparison)."""

_Signalled = tuple[Victim, att.AttemptRecord, bool]


def preempt_all(plane: ControlPlane, victims: Sequence[Victim]) -> list[Incident]:
    """Stop every victim (each job once); the incidents of victims that failed alone (their
    jobs are to be marked by the caller). Database-wide failures are raised."""
    unique: dict[str, Victim] = {}
    for v in victims:
        unique.setdefault(v.job_id, v)
    if not unique:
        return []
    if BATCH:
        try:
            return _batch_again_on_conflict(plane, list(unique.values()))
        except SYSTEMIC as exc:
            if not conflict(exc):
                raise  # no victim is to blame (database gone, deposed leader): the pass ends
            log.warning("preemption batch of %d aborted by lock conflicts; one by one instead",
                        len(unique))
        except Exception as exc:  # any failure of the batch: redo it victim by victim
            log.warning("preemption batch of %d failed (%s: %s); one by one instead",
                        len(unique), type(exc).__name__, exc)
    return _each(plane, list(unique.values()))


def _batch_again_on_conflict(plane: ControlPlane, victims: list[Victim]) -> list[Incident]:
    """The batch's read and signals once, its write transaction done again when PostgreSQL
    aborted it as a deadlock victim (nothing of it was kept; its effects run only after a
    commit). The write re-checks each job under its lock, so the read it works from may be
    old."""
    now = plane.clock()
    signalled, incidents = _read_and_signal(plane, victims)
    if not signalled:
        return incidents
    on_conflict(_write)(plane, signalled, now)  # the abort undid all of it: written again
    return incidents


def _read_and_signal(plane: ControlPlane,
                     victims: list[Victim]) -> tuple[list[_Signalled], list[Incident]]:
    """The victims' jobs and live attempts in one read; each victim still running signalled
    (a victim whose signal fails is left out: logged and its incident returned, or, with its
    backend unreachable, left to a next cycle)."""
    with plane.db.read() as s:
        jobs = jobs_by_ids(s, [v.job_id for v in victims])
        keys = [(j.id, j.attempt) for j in jobs.values() if j.state in HOLDING]
        attempts = {a.job_id: a for a in att.by_keys(s, keys)}
    out: list[_Signalled] = []
    incidents: list[Incident] = []
    mark_intents(plane, list(attempts.values()), plane.clock())
    for v in victims:
        attempt = attempts.get(v.job_id)
        if attempt is None:
            continue  # ended or moved on since the plan
        with JobGuard("preemption", v.job_id) as guard:
            signal = signal_victim(plane, v, attempt)
            if signal is not None:
                out.append((v, attempt, signal))
        if guard.incident is not None:
            incidents.append(guard.incident)
    return out, incidents


_CAUSES = ("preempt", *requeue.CAUSE_KINDS)
"""The cause keys (`<kind>:<attempt>`) of the transitions that end a victim's attempt
(preempt.end_locked, requeue.retry): looked up together before the victims are ended."""


def _write(plane: ControlPlane, signalled: list[_Signalled], now: datetime) -> None:
    """One transaction: the jobs locked in id order, their attempts read again under the
    locks, their ledger entries and their transitions' cause keys read at once (as a reconcile
    chunk's: broker.store.ledger_lookups, cause_lookups), each victim ended (end_locked), its
    writes queued and sent as one executemany per statement (broker.store.batch.deferred);
    the metrics counted once it committed. Each victim is met once (they are unique by job),
    so nothing a victim queued is read back."""
    ended: list[tuple[str, str]] = []
    with plane.db.write() as s:
        locked = records.lock_jobs(s, [v.job_id for v, _, _ in signalled])
        keys = sorted({(v.job_id, a.number) for v, a, _ in signalled})
        fresh = {a.job_id: a for a in att.by_keys(s, keys)}
        causes = [(job_id, f"{kind}:{n}") for job_id, n in keys for kind in _CAUSES]
        with ledger_lookups.read_ahead(s, keys), cause_lookups.read_ahead(s, causes), \
                batch.deferred(s, effects=False) as effects:
            for v, read, signal in sorted(signalled, key=lambda x: x[0].job_id):
                if end_locked(s, plane, locked.get(v.job_id), fresh.get(v.job_id),
                              read.number, v, signal, now):
                    ended.append((read.backend_name, v.message))
    effects.run_effects()  # once committed: a batch done again counts once
    for name, why in ended:
        log.info("preempted %s (%s)", name, why)


def _each(plane: ControlPlane, victims: list[Victim]) -> list[Incident]:
    """Victim by victim, each done again on a lock conflict (its signal sent again, as a next
    cycle would); after on_conflict's last try the victim is left to the next cycle."""
    incidents: list[Incident] = []
    for v in victims:
        with JobGuard("preemption", v.job_id) as guard:
            _stop(plane, v)
        if guard.incident is not None:
            incidents.append(guard.incident)
    return incidents


def _stop(plane: ControlPlane, victim: Victim) -> None:
    try:
        on_conflict(preempt)(plane, victim)
    except SYSTEMIC as exc:
        if not conflict(exc):
            raise
        log.warning("preemption of %s left to the next cycle: its last try also met a lock "
                    "conflict", victim.job_id)
