"""The admission cycle, carried out: heads -> snapshot -> nominate -> order -> admit (pure,
policies.admission) -> persist -> requeue the rest with reasons -> decision record.

Persisting an admission is one transaction per job: QUEUED -> ADMITTED through set_state (the
ledger rule writes the reservation), and the attempt row with its run snapshot and placement,
which is also the dispatcher's outbox entry.

One job never stops the cycle (broker.control.guard): a job whose admission view cannot be
built (a stored spec that does not parse) is left out and waits with InternalError; a
preemption plan that fails for one job counts as "no plan" for that job; a decision that
cannot be persisted is undone alone (its savepoint) and its job marked; one victim that
cannot be stopped does not keep the others from being stopped.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime

from sqlmodel import Session

from broker import ledger
from broker.control.faults import crash_point
from broker.control.guard import Incident, JobGuard, mark
from broker.control.plane import ControlPlane, add_placed_gpus, hold_in_flight, log
from broker.control.preempt import LazyPreemptor, preempt
from broker.domain import JobState, Reason
from broker.domain.attempts import RunSnapshot, backend_object_name
from broker.metrics import ADMISSION_CYCLE
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import set_state
from broker.policy_inputs import pending_job, quota_config
from broker.policy_inputs import usage as usage_view
from broker.store import attempts as att
from broker.store.queries import list_jobs
from broker.store.records import JobRecord
from policies.admission import CycleResult, Decision, admission_cycle
from policies.explain import explain
from policies.types import PendingJob

ADMISSION = "system:admission"
PERSIST_CHUNK = 100


def _pending_views(
    plane: ControlPlane, queued: list[JobRecord]
) -> tuple[list[PendingJob], list[Incident]]:
    """The admission views, and the jobs whose view could not be built (left out)."""
    views: list[PendingJob] = []
    incidents: list[Incident] = []
    for j in queued:
        with JobGuard("admission view", j.id) as guard:
            exclude = json.loads(j.exclude_json or "{}")
            views.append(
                pending_job(
                    plane.config, j.id, plane.spec(j.id, j.spec_json), j.created_at,
                    not_before=j.not_before, exclude_pools=exclude.get("pools", ()),
                    exclude_nodes=exclude.get("nodes", ()),
                )
            )
        if guard.incident is not None:
            incidents.append(guard.incident)
    return views, incidents


def _in_flight(live: list[att.AttemptRecord]) -> dict[tuple[str, str], int]:
    """GPUs per (pool, node) of attempts the backend has not shown us yet. An attempt whose
    snapshot cannot be read is skipped (logged): its nodes may then be offered again, which
    the backend refuses or queues, better than admitting nobody."""
    held: dict[tuple[str, str], int] = {}
    for a in live:
        if a.dispatch == att.CREATED and a.last_seen_at is not None:
            continue  # the backend's own inventory and queue depth account for it
        with JobGuard("in-flight view", a.job_id):
            add_placed_gpus(held, a)
    return held


def _admit(plane: ControlPlane, s: Session, job: JobRecord, d: Decision, now: datetime) -> bool:
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
        + ")",
        now=now,
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
    snapshot = RunSnapshot.of(spec).model_copy(
        update={"placement": d.placement, "backend_name": name, "resume_from": resume}
    )
    att.insert_attempt(
        s,
        att.AttemptRecord(
            job_id=job.id, number=number, snapshot_json=snapshot.model_dump_json(),
            spec_hash=job.spec_hash, backend_name=name, created_at=now,
            backend=d.placement.backend_instance, pool=d.placement.pool,
            flavor=d.placement.flavor, gpus=spec.gang.total_gpus, dispatch=att.PENDING,
            phase="PENDING", preempted=False,
        ),
    )
    return True


def _persist(plane: ControlPlane, chunk: list[Decision], by_id: dict[str, JobRecord],
             now: datetime) -> None:
    """One transaction per chunk of decisions (short write locks on SQLite, few commits);
    each decision in its own savepoint so that one refusal does not undo the others."""
    with plane.db.write() as s:
        for i, d in enumerate(chunk):
            job = by_id[d.job_id]
            with JobGuard("admission persist", job.id) as guard, s.begin_nested():
                # verdicts are kept for `isthmus explain` when the answer changes
                att.save_explanation(s, job.id, now, explain(d).model_dump_json())
                if d.admitted and d.placement is not None:
                    _admit(plane, s, job, d, now)
                    if i == 0 and len(chunk) > 1:
                        crash_point("mid-cycle")  # inside the transaction: all or nothing
                else:
                    set_state(s, job.id, JobState.QUEUED, d.reason,
                              Cause("admission", ADMISSION), d.message, now=now)
            if guard.incident is not None:  # its savepoint is undone; the others stand
                _mark(s, [guard.incident], now)


def _mark(s: Session, incidents: list[Incident], now: datetime) -> None:
    for incident in incidents:
        with JobGuard("marking", incident.job_id):
            mark(s, incident, ADMISSION, now)


def run_admission(plane: ControlPlane, limit: int = 10_000) -> CycleResult:
    with ADMISSION_CYCLE.time():
        return _run_admission(plane, limit)


def _run_admission(plane: ControlPlane, limit: int) -> CycleResult:
    now = plane.clock()
    with plane.db.read() as s:
        queued = list_jobs(s, states=[JobState.QUEUED.value], limit=limit, ascending=True)
        in_use = {k: v[0] for k, v in ledger.usage(s).items()}
        held = _in_flight(att.live(s))
    inventory = hold_in_flight(plane.inventory(), held)
    quotas = quota_config(plane.config)
    views, unreadable = _pending_views(plane, queued)
    if unreadable:
        with plane.db.write() as s:
            _mark(s, unreadable, now)
    result = admission_cycle(
        views, inventory, quotas,
        usage_view(in_use, plane.decayed_usage(in_use, now)), now,
        params=plane.params.admission, preemptor=LazyPreemptor(plane, quotas, now),
    )
    by_id = {j.id: j for j in queued}
    for d in result.decisions:  # victims first: signals go out before the space is handed on
        for victim in d.victims:
            with JobGuard("preemption", victim.job_id) as guard:
                preempt(plane, victim)
            if guard.incident is not None:
                with plane.db.write() as s:
                    _mark(s, [guard.incident], now)
    todo = [d for d in result.decisions
            if d.admitted or by_id[d.job_id].reason != d.reason.value
            or by_id[d.job_id].message != d.message]
    for start in range(0, len(todo), PERSIST_CHUNK):
        _persist(plane, todo[start:start + PERSIST_CHUNK], by_id, now)
        crash_point("after-intent-commit")
    crash_point("before-cycle-record")
    with plane.db.write() as s:
        record = asdict(result.record)
        att.insert_cycle(
            s, now, plane.epoch, result.record.inputs_digest, json.dumps(record, default=str)
        )
    log.info(
        "admission cycle: %d pending, %d admitted", result.record.pending, result.record.admitted
    )
    return result
