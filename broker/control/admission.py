"""The admission cycle, carried out: heads -> holds -> snapshot -> nominate -> order -> admit (pure,
policies.cycle) -> persist -> requeue the rest with reasons -> decision record.

Persisting an admission: QUEUED -> ADMITTED through set_state (the ledger rule writes the
reservation), the attempt row with its run snapshot and placement, which is also the
dispatcher's outbox entry, and the explanation. Decisions are persisted in chunks, one
transaction each, with each statement sent once per chunk for all its jobs
(broker.store.batch); a chunk whose batch fails is done again job by job, each in its savepoint.

One job never stops the cycle (broker.control.guard): a job whose admission view cannot be
built (a stored spec that does not parse) is left out and waits with InternalError; a
preemption plan that fails for one job counts as "no plan" for that job; a decision that
cannot be persisted is undone alone (broker.control.admission_writes) and its job marked; one
victim that cannot be stopped does not keep the others from being stopped.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime

from sqlmodel import Session

from broker import ledger
from broker.control import (
    admission_usage,
    budgets,
    decision_log,
    eta_inputs,
    holds,
    user_requeue,
)
from broker.control import admission_writes as writes
from broker.control.faults import crash_point
from broker.control.guard import Incident, JobGuard
from broker.control.plane import ControlPlane, hold_in_flight, log
from broker.control.preempt import LazyPreemptor
from broker.control.preempt_batch import preempt_all
from broker.control.soft_state import ViewKey, fresh
from broker.domain import JobState, reason_messages
from broker.domain.attempts import Placement
from broker.domain.exclusions import Exclusions
from broker.domain.inventory import InventorySnapshot
from broker.metrics import ADMISSION_CYCLE
from broker.policy_inputs import (
    concurrency,
    limits_configured,
    pending_job,
    queue_shares_configured,
    queues_configured,
    quota_config,
)
from broker.policy_inputs import usage as usage_view
from broker.store import attempts as att
from broker.store import concurrency as counts
from broker.store import requeue_requests, user_holds
from broker.store.pools import pool_states
from broker.store.queries import list_jobs
from broker.store.records import JobRecord
from broker.store.requeue_requests import RequeueRequest
from policies import eta
from policies.budgets import BudgetInputs
from policies.concurrency import ConcurrencyInputs
from policies.cycle import CycleResult, Decision, admission_cycle
from policies.run_length import RuntimeModel
from policies.types import PendingJob, QuotaConfig, Usage


def _pending_views(
    plane: ControlPlane, queued: list[JobRecord]
) -> tuple[list[PendingJob], list[Incident]]:
    """The admission views, and the jobs whose view could not be built (left out). A view is
    a function of the job's stored spec (never changes), its submission time, start time and
    exclusions, and the configuration, so it is built once per job and kept on the plane
    (soft state, only the jobs of this cycle kept): building the views of 2,600 waiting jobs
    was a quarter of a steady cycle on PostgreSQL."""
    cached = plane.soft.views
    known = cached[1] if cached is not None and cached[0] == id(plane.config) else {}
    kept: dict[ViewKey, PendingJob] = {}
    views: list[PendingJob] = []
    incidents: list[Incident] = []
    for j in queued:
        key = (j.id, j.created_at, j.not_before, j.exclude_json)
        view = known.get(key)
        if view is None:
            with JobGuard("admission view", j.id) as guard:
                exclude = Exclusions.from_json(j.exclude_json)
                view = pending_job(
                    plane.config, j.id, plane.spec(j.id, j.spec_json), j.created_at,
                    not_before=j.not_before, exclude_pools=exclude.pools,
                    exclude_nodes=exclude.nodes, user=j.submitted_by,
                )
            if guard.incident is not None:
                incidents.append(guard.incident)
            if view is None:
                continue
        kept[key] = view
        views.append(view)
    plane.soft.views = (id(plane.config), kept)
    return views, incidents


def _in_flight(plane: ControlPlane, s: Session) -> dict[tuple[str, str], int]:
    """GPUs per (pool, node) of attempts the backend has not shown running yet (those running
    are in its own inventory; one still starting may be there only in part, so its whole
    placement is held, at worst counting a node twice until every rank runs). An attempt
    whose snapshot cannot be read is skipped
    (logged): its nodes may then be offered again, which the backend refuses or queues,
    better than admitting nobody.

    Read every cycle, so only the narrow columns of the unseen attempts are; a snapshot never
    changes, so the nodes of its placement are parsed once (from the placement alone, not
    the whole run snapshot) and kept on the plane (soft state: re-read on loss)."""
    unseen = att.unseen(s)
    cache = plane.soft.placed_nodes
    missing = [(a.job_id, a.number) for a in unseen if (a.job_id, a.number) not in cache]
    fresh: dict[tuple[str, int], tuple[str, ...]] = {}
    for key, text in att.snapshots(s, missing).items():
        with JobGuard("in-flight view", key[0]):
            fresh[key] = _placed_nodes(text)
    held: dict[tuple[str, str], int] = {}
    kept: dict[tuple[str, int], tuple[str, ...]] = {}
    for a in unseen:
        key = (a.job_id, a.number)
        nodes = cache.get(key, fresh.get(key))
        if nodes is None:
            continue  # unreadable (logged above)
        kept[key] = nodes
        if nodes:
            per_replica = a.gpus // len(nodes)
            for node in nodes:
                held[(a.pool, node)] = held.get((a.pool, node), 0) + per_replica
    plane.soft.placed_nodes = kept
    return held


def _placed_nodes(snapshot_json: str) -> tuple[str, ...]:
    """The nodes of a run snapshot's placement (one per replica; none if placed by the
    backend itself), validated as a Placement."""
    placement = json.loads(snapshot_json).get("placement")
    if placement is None:
        return ()
    return Placement.model_validate(placement).nodes


def _forget_left(plane: ControlPlane, listed: frozenset[str], result: CycleResult) -> None:
    """Drops the kept specs of the jobs that waited after the last cycle and are not queued
    now: cancelled (by the API, which may be another process) or moved on otherwise; nothing
    here reads them again. An admitted job's spec stays for dispatch and the reconciler, which
    drops it when the job ends (ControlPlane.forget_specs)."""
    with plane.soft.lock:
        for job_id in plane.soft.waiting - listed:
            plane.soft.specs.pop(job_id, None)
    plane.soft.waiting = listed - {d.job_id for d in result.decisions if d.admitted}


def _moved(old: tuple[int, float | None, str] | None, new: eta.Estimate, now: datetime) -> bool:
    if old is None:
        return True
    position, at, method = old
    if position != new.position or method != new.method or (at is None) != (new.at is None):
        return True
    if at is None or new.at is None:
        return False
    # a start that slides by a minute or a tenth of the wait is not news
    drift = abs(new.at.timestamp() - at)
    return drift > max(60.0, 0.1 * max(0.0, at - now.timestamp()))


def _news(job: JobRecord, d: Decision, now: datetime) -> bool:
    return reason_messages.is_news(job.reason, job.message, job.updated_at, d.reason.value,
                                   d.message, now)


RUNTIME_MODEL_EVERY_S = 60.0
"""The run-time model (from the last RATIO_SAMPLES ended attempts) is learnt again at most this
often by the real cycle: a statistic over a thousand runs moves little in a minute, and
reading and learning them every cycle cost a tenth of a quiet cycle under the soak (every ten
seconds still 17% of the admission cycles' CPU in bench/loop_cost.py)."""


ESTIMATE_EVERY_S = 30.0
"""The queue's start estimates are made again at most this often by the real cycle, as Slurm's
backfill scheduler computes expected start times every `bf_interval` (30 s by default): a job
that starts waiting in between is explained without an estimate until the next estimating
cycle writes one (`refresh`). Estimating every cycle was a fifth of the loop's CPU per job
(bench/loop_cost.py), and a stored estimate is only rewritten when it moves by a minute or a
tenth of the wait anyway (`_moved`)."""


def _estimating(plane: ControlPlane, now: datetime) -> bool:
    """Whether this real cycle makes the estimates: none made yet by this process, the clock
    went back, or ESTIMATE_EVERY_S have passed since the last that had a job waiting."""
    return not fresh(plane.soft.estimated_at, now, ESTIMATE_EVERY_S)


def _runtime_model(plane: ControlPlane, s: Session, now: datetime) -> RuntimeModel:
    """The run-time model, learnt again when RUNTIME_MODEL_EVERY_S have passed (or the clock
    went back); kept on the plane between (soft state)."""
    cached = plane.soft.runtime_model
    if cached is not None and fresh(cached[0], now, RUNTIME_MODEL_EVERY_S):
        return cached[1]
    model = eta_inputs.runtime_model(plane, s, prune=True)
    plane.soft.runtime_model = (now, model)
    return model


@dataclass
class CycleInputs:
    """What one admission cycle decides on: the queued jobs, their views, one inventory
    snapshot (with in-flight attempts held), quotas and usage, and the time."""

    queued: list[JobRecord]
    views: list[PendingJob]
    inventory: InventorySnapshot
    quotas: QuotaConfig
    usage: Usage
    now: datetime
    unreadable: list[Incident]
    runtimes: RuntimeModel = field(default_factory=RuntimeModel)
    running: list[eta.Running] = field(default_factory=list)
    concurrency: ConcurrencyInputs | None = None
    """Limits and counts per team and user; None when no running-jobs or GPU limit is set."""
    requeues: list[RequeueRequest] = field(default_factory=list)
    """Requeues users asked for (scontrol requeue), carried out by the real cycle first."""
    budgets: BudgetInputs | None = None
    """GPU-hour budgets in their current periods with their use; None when none is set."""
    listed: frozenset[str] = frozenset()
    """Every QUEUED job read, held ones too (`queued` is those not held)."""


def cycle_inputs(plane: ControlPlane, now: datetime, limit: int = 10_000, *,
                 fold_usage: bool = True, estimate: bool = True) -> CycleInputs:
    """Reads the inputs of a cycle. The fair-share history is read from the ledger, so a
    what-if (`fold_usage=False`, kept for its callers) never changes what the next real cycle
    decides either way. `estimate=False`: a real cycle that makes no estimates (their inputs,
    the run-time model and the running work, are not read)."""
    decayed: dict[tuple[str, str], float] | None = None
    with plane.db.read() as s:
        queued = list_jobs(s, states=[JobState.QUEUED.value], limit=limit, ascending=True)
        listed = frozenset(j.id for j in queued)
        in_use = {k: v[0] for k, v in ledger.usage(s).items()}
        held = _in_flight(plane, s)
        # what the jobs that will wait are measured against: nothing when nothing is queued
        # (a what-if always has its own job); the estimates' inputs only when estimating
        waiting = bool(queued) or not fold_usage
        estimating = waiting and (estimate or not fold_usage)
        runtimes = (_runtime_model(plane, s, now) if fold_usage else
                    eta_inputs.runtime_model(plane, s)) if estimating else RuntimeModel()
        running = (eta_inputs.running_work(plane, s, runtimes, now, keep=fold_usage)
                   if estimating else [])
        limits = concurrency(plane.config, counts.held_by_user(s)) \
            if limits_configured(plane.config) else None
        by_queue = counts.held_by_queue(s) if waiting and queues_configured(plane.config) \
            else {}
        by_queue_flavor = counts.held_by_queue_flavor(s) \
            if waiting and queue_shares_configured(plane.config) else {}
        spent = budgets.budget_inputs(plane, s)
        if fold_usage:  # the real cycle: only what changed since the last one is read
            decayed = admission_usage.decayed_usage(plane, s, now, in_use)
        by_user = user_holds.held(s) if fold_usage and queued else {}
        requeues = requeue_requests.pending(s) if fold_usage else []
        admin = pool_states(s)  # the drains, for the inventory asked of the backends next
    if fold_usage:  # the real cycle: held jobs get their reason and stay out (a plan only reads)
        # start times, dependencies, array limits, approvals
        queued = holds.apply_holds(plane, queued, by_user, now)
    inventory = hold_in_flight(plane.inventory(admin), held)
    views, unreadable = _pending_views(plane, queued)
    if decayed is None:  # a what-if reads the ledger whole: it moves no state of the real cycle
        decayed = plane.decayed_usage(in_use, now)
    return CycleInputs(queued, views, inventory, quota_config(plane.config),
                       usage_view(in_use, decayed, by_queue, by_queue_flavor), now, unreadable,
                       runtimes, running, limits, requeues, spent, listed)


def decide(
    plane: ControlPlane, inputs: CycleInputs, extra: tuple[PendingJob, ...] = (), *,
    estimate: bool = True,
) -> tuple[CycleResult, dict[str, eta.Estimate]]:
    """The pure admission cycle and the queue estimates over `inputs` (plus `extra` jobs that
    are not stored: a what-if). Shared by the real cycle and `POST /v1/plan`."""
    views = [*inputs.views, *extra]
    result = admission_cycle(
        views, inputs.inventory, inputs.quotas, inputs.usage, inputs.now,
        params=plane.params.admission, preemptor=LazyPreemptor(plane, inputs.quotas, inputs.now),
        concurrency=inputs.concurrency, budgets=inputs.budgets,
    )
    if not estimate:
        return result, {}
    estimates = eta.estimate(
        result.decisions, {v.id: v for v in views}, inputs.inventory, inputs.now,
        runtime_factor=inputs.runtimes.factor(), model=inputs.runtimes, running=inputs.running,
    )
    return result, estimates


def run_admission(plane: ControlPlane, limit: int = 10_000) -> CycleResult:
    with ADMISSION_CYCLE.time():
        return _run_admission(plane, limit)


def _run_admission(plane: ControlPlane, limit: int) -> CycleResult:
    now = plane.clock()
    estimating = _estimating(plane, now)
    inputs = cycle_inputs(plane, now, limit, estimate=estimating)
    if inputs.requeues:  # the jobs go back to the queue: the next cycle considers them
        user_requeue.carry_out(plane, inputs.requeues, now)
    queued = inputs.queued
    if inputs.unreadable:
        with plane.db.write() as s:
            writes.mark_all(s, inputs.unreadable, now)
    result, estimates = decide(plane, inputs, estimate=estimating)
    if estimating and not all(d.admitted for d in result.decisions):
        plane.soft.estimated_at = now  # a job that starts to wait after an idle spell: at once
    _forget_left(plane, inputs.listed, result)
    by_id = {j.id: j for j in queued}
    # victims first, all in one batch: signals go out before the space is handed on
    failed = preempt_all(plane, [v for d in result.decisions for v in d.victims])
    if failed:
        with plane.db.write() as s:
            writes.mark_all(s, failed, now)
    # a waiting job whose reason stays is not written again (nor its event, explanation or
    # logged decision) for new figures in its message: broker.domain.reason_messages
    todo = [d for d in result.decisions if d.admitted or _news(by_id[d.job_id], d, now)]
    for start in range(0, len(todo), writes.PERSIST_CHUNK):
        writes.persist(plane, todo[start:start + writes.PERSIST_CHUNK], by_id, now, estimates)
        crash_point("after-intent-commit")
    stored = plane.soft.estimated  # losing it (a restart) costs one rewrite of each estimate
    changed = {d.job_id for d in todo}
    refresh = [d for d in result.decisions if not d.admitted and d.job_id not in changed
               and d.job_id in estimates
               and estimates[d.job_id].position <= eta.MAX_ESTIMATED
               and _moved(stored.get(d.job_id), estimates[d.job_id], now)]
    for start in range(0, len(refresh), writes.PERSIST_CHUNK):
        writes.refresh(plane, refresh[start:start + writes.PERSIST_CHUNK], now, estimates)
    saved = changed | {d.job_id for d in refresh}
    # a cycle that made no estimates keeps those stored for the jobs still waiting (a job
    # written now was written without one: the next estimating cycle writes it)
    waiting = set(estimates) if estimating else {
        d.job_id for d in result.decisions if not d.admitted}
    kept = {j: v for j, v in stored.items() if j in waiting and j not in saved}
    stored.clear()  # ended and admitted jobs drop out
    stored.update(kept)
    for job_id in saved:
        e = estimates.get(job_id)
        if e is not None:
            stored[job_id] = (e.position, e.at.timestamp() if e.at else None, e.method)
    try:  # telling is not deciding: a failure here is told again by the next cycle
        budgets.tell_thresholds(plane, inputs.budgets)
    except Exception:
        log.exception("budget thresholds could not be told; the next cycle tries again")
    crash_point("before-cycle-record")
    # An idle cycle (no job to decide) changes and explains nothing: a run of them is one
    # stored row, the first's, counting the others (revision 0016).
    idle = not result.decisions
    folded = plane.soft.idle_cycle if idle else None
    with plane.db.write() as s:
        if folded is None or not att.fold_idle_cycle(s, folded, plane.epoch, now):
            record = asdict(result.record)
            folded = att.insert_cycle(
                s, now, plane.epoch, result.record.inputs_digest,
                json.dumps(record, default=str),
            )
        logged = decision_log.record(s, plane, folded, now, result.decisions,
                                     {j.id: j.team for j in queued}, changed)
    decision_log.remember(plane, logged)
    plane.soft.idle_cycle = folded if idle else None
    # a cycle that admitted is news; one that only looked is not (the jobs' own lines tell
    # what changed: broker.orchestration.story_rule)
    log.log(logging.INFO if result.record.admitted else logging.DEBUG,
            "admission cycle: %d pending, %d admitted", result.record.pending,
            result.record.admitted)
    return result
