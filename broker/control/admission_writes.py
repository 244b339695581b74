"""Writing an admission cycle's decisions (broker.control.admission decides them).

Each decision writes its explanation, and its admission (QUEUED -> ADMITTED through set_state,
whose ledger rule writes the reservation, and the attempt row: run snapshot, placement, the
dispatcher's outbox entry) or its waiting reason. Decisions are written in chunks of
PERSIST_CHUNK, one transaction each, every statement sent once per chunk for all its jobs
(broker.store.batch): a job whose step fails is cut out of the batch alone and marked; a batch
that fails as a whole is done again job by job, each in its own savepoint, as before batching.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from broker.control.faults import crash_point
from broker.control.guard import SYSTEMIC, Incident, JobGuard, mark
from broker.control.plane import ControlPlane, log
from broker.domain import JobState, Reason
from broker.domain.attempts import RunSnapshot, backend_object_name
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import batch, queries, records, user_holds
from broker.store.conflicts import on_conflict
from broker.store.records import JobRecord
from policies import eta
from policies.cycle import Decision
from policies.explain import explain

ADMISSION = "system:admission"
PERSIST_CHUNK = 200
BATCH = True
"""Write a chunk's decisions with statements batched across its jobs (False: one savepoint
per job, the fallback when a batch fails; switchable for bench/admission.py's ratio)."""


def _lowest_class(plane: ControlPlane) -> str | None:
    lowest = plane.config.lowest_priority_class()
    return lowest.name if lowest is not None else None


def _admit(plane: ControlPlane, s: Session, job: JobRecord, d: Decision, now: datetime,
           locked: JobRecord | None = None) -> bool:
    assert d.placement is not None
    spec = plane.spec(job.id, job.spec_json)
    details = {
        "reservation": {
            "flavor": d.placement.flavor, "gpus": spec.gang.total_gpus,
            "borrowed_gpus": d.borrowed_gpus,
        },
        "placement": d.placement.model_dump(mode="json"),
        "epoch": plane.epoch,
    }
    result = set_state(
        s, job.id, JobState.ADMITTED, Reason.Admitted,
        Cause("admission", ADMISSION, details=details),
        f"admitted to {d.placement.pool} ({d.placement.flavor}"
        + (f", {d.placement.topology_domain}" if d.placement.topology_domain else "")
        + ")" + (f"; {d.demoted}" if d.demoted else ""),
        now=now, locked=locked,
    )
    if not result.accepted:
        return False  # cancelled meanwhile: nothing reserved, nothing to dispatch
    number = result.job.attempt
    name = backend_object_name(job.id, number)
    resume = None
    if spec.checkpoint.resumable and number > 1:
        # the latest checkpoint an earlier attempt reported; the static directory only if none
        reported = att.last_checkpoint(s, job.id, before=number)
        resume = reported.path if reported is not None else spec.checkpoint.dir
    # RunSnapshot.of's fields, with the hash stored at submission (the attempt row's too)
    # rather than computed again from the parsed spec for every admission
    snapshot = RunSnapshot(
        spec=spec, spec_hash=job.spec_hash, code_version=spec.code_version,
        data_version=spec.data_version, placement=d.placement, backend_name=name,
        resume_from=resume, admitted_as=_lowest_class(plane) if d.demoted else None,
    )
    att.insert_attempt(
        s,
        att.AttemptRecord(
            job_id=job.id, number=number,
            # `admitted_as` only when set: every other snapshot stays as older replicas read it
            snapshot_json=snapshot.model_dump_json(
                exclude={"admitted_as"} if snapshot.admitted_as is None else None),
            spec_hash=job.spec_hash, backend_name=name, created_at=now,
            backend=d.placement.backend_instance, pool=d.placement.pool,
            flavor=d.placement.flavor, gpus=spec.gang.total_gpus, dispatch=att.PENDING,
            phase="PENDING", preempted=False,
        ),
    )
    return True


def _persist_one(plane: ControlPlane, s: Session, job: JobRecord, d: Decision, now: datetime,
                 estimates: dict[str, eta.Estimate], locked: JobRecord | None = None) -> None:
    """One decision's writes: its explanation, and its admission or its waiting reason."""
    # verdicts are kept for `isthmus explain` when the answer changes
    att.save_explanation(s, job.id, now, explain(d, estimates.get(d.job_id)).model_dump_json())
    if d.admitted and d.placement is not None:
        _admit(plane, s, job, d, now, locked)
    else:
        set_state(s, job.id, JobState.QUEUED, d.reason, Cause("admission", ADMISSION),
                  d.message, now=now, locked=locked)


def persist(plane: ControlPlane, chunk: list[Decision], by_id: dict[str, JobRecord],
             now: datetime, estimates: dict[str, eta.Estimate]) -> None:
    """One transaction per chunk of decisions (short write locks on SQLite, few commits),
    its statements batched across the chunk's jobs; if the batch fails as a whole, the chunk
    is done again job by job."""
    if BATCH and len(chunk) > 1:
        try:
            records.with_late_locks(lambda lock_first: _persist_batched(
                plane, chunk, by_id, now, estimates, lock_first=lock_first))
            return
        except SYSTEMIC:
            raise  # no job is to blame (database gone, deposed leader): the pass ends
        except Exception as exc:  # any failure of the batch: redo it per job
            log.warning("admission persist: batch of %d failed (%s: %s); per job instead",
                        len(chunk), type(exc).__name__, exc)
    _persist_each(plane, chunk, by_id, now, estimates)


@on_conflict  # a deadlock victim's chunk is written again: the abort undid all of it
def _persist_batched(plane: ControlPlane, chunk: list[Decision], by_id: dict[str, JobRecord],
                     now: datetime, estimates: dict[str, eta.Estimate], *,
                     lock_first: bool) -> None:
    """The chunk's jobs read (`lock_first`: locked in one statement; else read without a lock
    and locked in one statement once every write is queued, `records.lock_unmoved`: a cancel
    or a hold of one of them waits for the chunk's statements and commit, not for the Python
    that decides them; JobsMoved if one changed meanwhile), their writes queued
    (broker.store.batch) and sent as one executemany per statement. A job whose step fails is
    cut out of the batch (its queued writes dropped, as its savepoint would have been) and
    marked after it. The transition metrics are counted once the chunk committed: a chunk that
    fails here and is done again job by job counts each transition once."""
    incidents: list[Incident] = []
    ids = [d.job_id for d in chunk]
    with plane.db.write() as s:
        locked = records.lock_jobs(s, ids) if lock_first else queries.jobs_by_ids(s, ids)
        seen = {job.id: job.last_seq for job in locked.values()}
        chunk = _not_held(s, chunk)
        with batch.deferred(s, effects=False) as queued:
            for i, d in enumerate(chunk):
                mark = queued.mark()
                with JobGuard("admission persist", d.job_id) as guard:
                    _persist_one(plane, s, by_id[d.job_id], d, now, estimates,
                                 locked.get(d.job_id))
                    if i == 0 and d.admitted:
                        crash_point("mid-cycle")  # inside the transaction: all or nothing
                if guard.incident is not None:
                    queued.cut(mark)
                    incidents.append(guard.incident)
            if not lock_first:
                records.lock_unmoved(s, seen)  # before the queued writes are sent
        mark_all(s, incidents, now)
    queued.run_effects()  # the transition metrics, once the chunk is committed


def _persist_each(plane: ControlPlane, chunk: list[Decision], by_id: dict[str, JobRecord],
                  now: datetime, estimates: dict[str, eta.Estimate]) -> None:
    """Each decision in its own savepoint so that one refusal does not undo the others."""
    with plane.db.write() as s:
        for i, d in enumerate(_not_held(s, chunk)):
            job = by_id[d.job_id]
            with JobGuard("admission persist", job.id) as guard, s.begin_nested():
                _persist_one(plane, s, job, d, now, estimates)
                if i == 0 and len(chunk) > 1 and d.admitted:
                    crash_point("mid-cycle")  # inside the transaction: all or nothing
            if guard.incident is not None:  # its savepoint is undone; the others stand
                mark_all(s, [guard.incident], now)


def _not_held(s: Session, chunk: list[Decision]) -> list[Decision]:
    """The chunk without admissions of jobs a user held after the cycle read them (read in
    the chunk's transaction: a hold that committed first is seen; one that commits before the
    chunk locks its jobs moves its job, and the chunk is written again, locked first; one that
    waits for the lock then finds them ADMITTED and is refused). The next cycle gives those
    JobHeldUser."""
    admitted = [d.job_id for d in chunk if d.admitted]
    held = user_holds.held(s, admitted) if admitted else {}
    return [d for d in chunk if d.job_id not in held] if held else chunk


def mark_all(s: Session, incidents: list[Incident], now: datetime) -> None:
    for incident in incidents:
        with JobGuard("marking", incident.job_id):
            mark(s, incident, ADMISSION, now)


def refresh(plane: ControlPlane, decisions: list[Decision], now: datetime,
            estimates: dict[str, eta.Estimate]) -> None:
    """Re-save the explanations of waiting jobs whose position or estimate moved although
    their reason did not (only estimate fields differ from what is stored): one batched
    statement (a job whose explanation cannot be built is left out, logged), or one savepoint
    per job if the batch fails."""
    if BATCH:
        try:
            with plane.db.write() as s, batch.deferred(s):
                for d in decisions:
                    with JobGuard("estimate persist", d.job_id):
                        payload = explain(d, estimates.get(d.job_id)).model_dump_json()
                        att.save_explanation(s, d.job_id, now, payload)
            return
        except SYSTEMIC:
            raise
        except Exception as exc:  # any failure of the batch: redo it per job
            log.warning("estimate persist: batch of %d failed (%s: %s); per job instead",
                        len(decisions), type(exc).__name__, exc)
    with plane.db.write() as s:
        for d in decisions:
            with JobGuard("estimate persist", d.job_id), s.begin_nested():
                att.save_explanation(
                    s, d.job_id, now, explain(d, estimates.get(d.job_id)).model_dump_json()
                )
