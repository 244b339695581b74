"""One admission cycle: pending jobs + inventory + quotas + usage + now -> decisions.

Phases (Kueue's, numbered in the decision record):
  1 heads      jobs still in retry backoff wait (BackoffAfterFailure); jobs of a team or user
               whose GPU-hour budget is spent wait (BudgetExhausted, `enforce: stop`) or go on
               as the lowest priority class (`enforce: lowest`; policies/budgets.py); the rest
               are eligible
  2 snapshot   working copies of capacity (CapacityIndex) and of the ledger (QuotaState);
               free GPUs that Isthmus jobs already queued in a backend can start on are held
               first (policies/backlog.py)
  3 nominate   candidate pools per job (flavor, backend kind), cached per job shape
  4 order      priority, then fair share, then submission time (FairQueue)
  5 admit      per job: the team's and user's concurrency limits (policies/concurrency.py, charged
               per admission); per flavor its team queue's share (policies/queue_share.py,
               charged per admission) and its team's quota; gang placement on the working copy;
               on success the capacity and the quota are reserved at once so later jobs see them
               taken; a starving gang that does not fit holds capacity in one domain
               (reservation: where it would fit soonest by the nodes' expected releases, else
               the most free) so smaller jobs may backfill elsewhere but not in front of it; a
               later job that does not fit otherwise may run on held GPUs where, by its time
               limit, it does not delay the gang's expected start (policies/backfill.py); a job
               that may preempt (lower priority work in its pool, or of its own team when its
               quota is full) or reclaim lent quota asks the preemption oracle; for priority
               preemption it passes the pool's node-level room (free GPUs per node and the
               domain of each node at the job's required level), so victims are only chosen
               where their end lets the gang fit, fragmented pools included
  6 requeue    every other job waits with the most severe reason and all per-pool verdicts
A waiting job whose pools had room at the start of the cycle, taken by jobs admitted before it,
is shown as HigherPriorityAhead or FairShareBehind rather than as a capacity problem.

Pure: no clock, no I/O; the same inputs give the same decisions and the same digest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason
from policies import queue_guard, queue_share
from policies.backfill import Backfill, Held, try_backfill
from policies.backlog import hold_backend_queue
from policies.budgets import BudgetInputs
from policies.capacity import CapacityIndex, PoolIndex
from policies.concurrency import ConcurrencyInputs, ConcurrencyState
from policies.decisions import CycleRecord, CycleResult, Decision, inputs_digest
from policies.ordering import FairQueue, FairShare, OrderingParams, is_starving
from policies.placement import (
    PlacementParams,
    PlacementResult,
    candidate_pools,
    commit,
    max_level,
    place,
)
from policies.preemption import Mode, PreemptionPlan, Victim
from policies.queue_share import QueueShares
from policies.quota import QuotaState, QuotaVerdict
from policies.room import node_domains, pool_room
from policies.types import PendingJob, PoolRoom, QuotaConfig, Usage

__all__ = ["AdmissionParams", "CycleRecord", "CycleResult", "Decision", "PreemptionOracle",
           "admission_cycle", "inputs_digest", "node_domains", "pool_room"]

_CAPACITY = frozenset({Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable})


class PreemptionOracle(Protocol):
    """What admission asks of preemption (implemented by policies.preemption.Preemptor)."""

    def plan(
        self,
        job: PendingJob,
        mode: Mode,
        gpus_needed: int,
        pool: str | None,
        flavor: str | None,
        room: PoolRoom | None = None,
    ) -> PreemptionPlan:
        """Victims for `job`; `room` (priority mode) is where the gang must fit in `pool`."""
        ...


@dataclass(frozen=True, slots=True)
class AdmissionParams:
    placement: PlacementParams = field(default_factory=PlacementParams)
    ordering: OrderingParams = field(default_factory=OrderingParams)
    max_admissions: int | None = None
    """Stop admitting after this many in one cycle (None: no limit)."""


class _Cycle:
    def __init__(
        self,
        index: CapacityIndex,
        quota: QuotaState,
        share: FairShare,
        now: datetime,
        params: AdmissionParams,
        preemptor: PreemptionOracle | None,
        concurrency: ConcurrencyState | None = None,
        shares: QueueShares | None = None,
    ) -> None:
        self.index = index
        self.shares = shares
        """Caps of the team queues with a share and what they hold, charged per admission."""
        self.concurrency = concurrency
        """Running jobs and GPUs held per team and user, charged as jobs are admitted."""
        self.quota = quota
        self.share = share
        self.now = now
        self.params = params
        self.preemptor = preemptor
        self.reservations = 0
        self.admitted = 0
        self._cands: dict[tuple[tuple[str, ...], str], list[PoolIndex]] = {}
        self._domains: dict[tuple[str, int], dict[str, str]] = {}
        self.holds: dict[str, list[Held]] = {}
        """Capacity held for starving gangs this cycle, by pool (policies/backfill.py)."""

    def candidates(self, job: PendingJob) -> list[PoolIndex]:
        key = (job.flavors, job.backend)
        c = self._cands.get(key)
        if c is None:
            c = self._cands[key] = candidate_pools(job, self.index)
        return c

    def decide(self, job: PendingJob, position: int) -> Decision:
        limit = self.params.max_admissions
        if limit is not None and self.admitted >= limit:
            return Decision(job.id, False, Reason.WaitingForAdmission,
                            f"this cycle admitted its limit of {limit} jobs", position=position)
        if self.concurrency is not None:
            over = self.concurrency.blocked(job)
            if over is not None:
                return Decision(job.id, False, over[0], over[1], position=position)
        cands = self.candidates(job)
        o = self.params.ordering
        if is_starving(job, self.now, o) and self.reservations < o.max_reservations:
            waited = (self.now - job.submitted_at).total_seconds()  # before it is placed:
            queue_guard.free_held_domain(cands, job, waited, o)
        gpus = job.total_gpus
        verdicts: dict[str, QuotaVerdict] = {}
        blocked: dict[str, tuple[Reason, str]] = {}
        for flavor in job.flavors:
            # the queue's share first: reclaiming or preempting for the team's quota would
            # not get the queue past it
            capped = self.shares.check(job, flavor) if self.shares is not None else None
            if capped is not None:
                qv = QuotaVerdict(False, Reason.QueueShareReached, capped)
            else:
                qv = self.quota.check(job.team, flavor, gpus)
            verdicts[flavor] = qv
            if not qv.ok:
                blocked[flavor] = (qv.reason, qv.message)
        result = place(job, self.index, self.params.placement, blocked, cands)
        if result.placement is not None and not result.queued:
            return self._admit(job, result, verdicts[result.placement.flavor], position)
        if self.holds:  # starting now on held GPUs beats waiting, here or in a backend queue
            short = {v.pool for v in result.verdicts if v.reason in _CAPACITY or v.queued}
            o = self.params.ordering
            bf = try_backfill(job, [p for p in cands if p.name in short], self.holds, self.now,
                              o.backfill_factor, o.backfill_margin_s)
            if bf is not None:
                return self._backfilled(job, bf, result, verdicts, position)
        if result.placement is not None:
            return self._admit(job, result, verdicts[result.placement.flavor], position)
        return self._wait(job, result, verdicts, cands, position)

    def _backfilled(self, job: PendingJob, bf: Backfill, result: PlacementResult,
                    verdicts: dict[str, QuotaVerdict], position: int) -> Decision:
        pl, qv = bf.placement, verdicts[bf.placement.flavor]
        self._charge(job, pl.flavor)
        self.quota.reserve(job.team, pl.flavor, job.total_gpus)
        self.share.charge(job.team, pl.flavor, job.total_gpus, job.queue)
        self.admitted += 1
        pool = self.index.pools[pl.pool]
        pool.admitted += 1
        if pool.admitted_max_priority is None or job.priority > pool.admitted_max_priority:
            pool.admitted_max_priority = job.priority
        msg = (f"{pl.pool}: backfilled, {bf.lent} of its GPUs held for starving gang "
               f"{bf.held.job_id} in {bf.held.domain or '*'}; by its time limit and the "
               "backends' margin past it, it does not delay that gang's expected start")
        if qv.borrowed:
            msg = f"{msg}; {qv.message}"
        return Decision(job.id, True, Reason.Admitted, msg, pl, result.verdicts, qv.borrowed,
                        position=position)

    def _admit(
        self, job: PendingJob, result: PlacementResult, qv: QuotaVerdict, position: int
    ) -> Decision:
        assert result.placement is not None
        flavor = result.placement.flavor
        self._charge(job, flavor)
        self.quota.reserve(job.team, flavor, job.total_gpus)
        commit(job, result, self.index)
        self.share.charge(job.team, flavor, job.total_gpus, job.queue)
        self.admitted += 1
        msg = result.message
        if qv.borrowed:
            msg = f"{msg}; {qv.message}"
        return Decision(
            job.id,
            True,
            Reason.Admitted,
            msg,
            result.placement,
            result.verdicts,
            qv.borrowed,
            position=position,
        )

    def _charge(self, job: PendingJob, flavor: str) -> None:
        if self.concurrency is not None:
            self.concurrency.charge(job)
        if self.shares is not None:
            self.shares.charge(job, flavor)

    def _wait(
        self,
        job: PendingJob,
        result: PlacementResult,
        quotas: dict[str, QuotaVerdict],
        cands: list[PoolIndex],
        position: int,
    ) -> Decision:
        reason, message = result.reason, result.message
        victims: tuple[Victim, ...] = ()
        reservation: str | None = None
        if self.preemptor is not None:
            plan, note = self._preempt(job, result, quotas)
            if note is not None:
                message = f"{message}; {note}"
            if plan is not None:
                return Decision(
                    job.id,
                    False,
                    plan.reason,
                    plan.message,
                    None,
                    result.verdicts,
                    victims=plan.victims,
                    position=position,
                )
        if reason in _CAPACITY:
            ahead = self._ahead(job, result)
            if ahead is not None:
                reason, message = ahead, f"{ahead.value}: {message}"
            if (
                is_starving(job, self.now, self.params.ordering)
                and self.reservations < self.params.ordering.max_reservations
            ):
                reservation = self._reserve(job, result, cands)
                if reservation is not None:
                    message = f"{message}; capacity held for this gang in {reservation}"
        return Decision(
            job.id,
            False,
            reason,
            message,
            None,
            result.verdicts,
            victims=victims,
            reservation=reservation,
            position=position,
        )

    def _ahead(self, job: PendingJob, result: PlacementResult) -> Reason | None:
        """HigherPriorityAhead / FairShareBehind when the pools that now lack capacity had
        enough at the start of the cycle and gave it to jobs ordered before this one."""
        best: int | None = None
        for v in result.verdicts:
            if v.reason not in _CAPACITY:
                continue
            pool = self.index.pools[v.pool]
            if pool.start_free >= job.total_gpus and pool.admitted_max_priority is not None:
                p = pool.admitted_max_priority
                best = p if best is None else max(best, p)
        if best is None:
            return None
        return Reason.HigherPriorityAhead if best > job.priority else Reason.FairShareBehind

    def _reserve(
        self, job: PendingJob, result: PlacementResult, cands: list[PoolIndex]
    ) -> str | None:
        ok = {v.pool for v in result.verdicts if v.reason in _CAPACITY}
        pools = [p for p in cands if p.name in ok]
        if not pools:
            return None
        rank = {f: i for i, f in enumerate(job.flavors)}
        g, level, o = job.gpus_per_replica, max_level(job), self.params.ordering
        waited = (self.now - job.submitted_at).total_seconds()
        targets = {p.name: queue_guard.hold_target(p, job, level, waited, o) for p in pools}

        def ready(p: PoolIndex) -> float:
            t = targets[p.name]
            return math.inf if t is None else queue_guard.rank(p, job.id, waited, o, t.ready)

        # within a flavor, the pool whose domain drains soonest (without release data: the most
        # free GPUs; a hold guarded by exclusion stays in one pool: policies/queue_guard.py)
        pool = min(pools, key=lambda p: (rank.get(p.flavor, 99), ready(p), -p.free, p.name))
        target = targets[pool.name]
        claimed = frozenset(pool.claimed)  # as `target.ready` was computed; hold() adds to it
        held = pool.hold(g, job.replicas, level, target)
        if held is None or target is None:
            return None
        self.reservations += 1
        queue_guard.guard(pool, job.id, target.domain, target.nodes, waited, o)
        if pool.admitted_max_priority is None or job.priority > pool.admitted_max_priority:
            pool.admitted_max_priority = job.priority
        domain, per_node = held
        if self.params.ordering.backfill:
            self.holds.setdefault(pool.name, []).append(
                Held(job.id, domain, g, job.replicas, target.ready, target.nodes, per_node,
                     claimed=claimed))
        return f"{pool.name}:{domain or '*'} ({sum(per_node.values())} GPUs)"

    def _preempt(
        self, job: PendingJob, result: PlacementResult, quotas: dict[str, QuotaVerdict]
    ) -> tuple[PreemptionPlan | None, str | None]:
        """A plan with victims, or None and why priority preemption would not help."""
        assert self.preemptor is not None
        for flavor in job.flavors:
            qv = quotas.get(flavor)
            if qv is not None and qv.reclaim > 0:
                plan = self.preemptor.plan(job, "reclaim", qv.reclaim, None, flavor)
                if plan.ok:
                    return plan, None
        if not job.can_preempt:
            return None, None
        for flavor in job.flavors:
            qv = quotas.get(flavor)
            if qv is None or qv.ok or qv.reclaim > 0 or qv.reason is Reason.QueueShareReached:
                continue
            need = self.quota.over_nominal(job.team, flavor, job.total_gpus)
            if need:
                plan = self.preemptor.plan(job, "team", need, None, flavor)
                if plan.ok:
                    return plan, None
        return self._preempt_priority(job, result)

    def _preempt_priority(
        self, job: PendingJob, result: PlacementResult
    ) -> tuple[PreemptionPlan | None, str | None]:
        assert self.preemptor is not None
        level = max_level(job)
        note: str | None = None
        for v in result.verdicts:
            if v.reason not in _CAPACITY:
                continue
            pool = self.index.pools[v.pool]
            if pool.static_cap(job.gpus_per_replica, level) < job.replicas:
                continue  # too large for the pool even when empty
            short = max(0, job.total_gpus - pool.free)
            room = self._room(job, pool, level)
            plan = self.preemptor.plan(job, "priority", short, pool.name, pool.flavor, room)
            if plan.ok:
                return plan, None
            if note is None:
                note = f"{pool.name}: {plan.message}"
        return None, note

    def _room(self, job: PendingJob, pool: PoolIndex, level: int) -> PoolRoom:
        domains = self._domains.get((pool.name, level))
        if domains is None:  # topology does not change within a cycle
            domains = self._domains[(pool.name, level)] = node_domains(pool, level)
        return pool_room(pool, level, job.exclude_nodes, domains)


def admission_cycle(
    pending: Iterable[PendingJob],
    inventory: InventorySnapshot,
    quotas: QuotaConfig,
    usage: Usage,
    now: datetime,
    params: AdmissionParams | None = None,
    preemptor: PreemptionOracle | None = None,
    concurrency: ConcurrencyInputs | None = None,
    budgets: BudgetInputs | None = None,
) -> CycleResult:
    """Decide for every pending job: admit (with a placement) or wait (with a reason).
    `concurrency`: limits and counts per team and user (policies.concurrency), checked before
    a job is placed. `budgets`: GPU-hour budgets in their current periods (policies.budgets),
    applied at the heads."""
    params = params or AdmissionParams()
    jobs = list(pending)
    # 1 heads
    eligible: list[PendingJob] = []
    later: list[Decision] = []
    demoted: dict[str, str] = {}  # job id -> why it goes on as the lowest class
    for j in jobs:
        verdict = budgets.verdict(j) if budgets is not None else None
        if verdict is not None and verdict.reason is not None:
            later.append(Decision(j.id, False, verdict.reason, verdict.message))
            continue
        if verdict is not None and budgets is not None:
            demoted[j.id] = verdict.message
            j = budgets.demoted(j)
        if j.not_before is not None and j.not_before > now:
            # the end, not a countdown: a message that changed every cycle would append an
            # event per waiting job per cycle
            until = j.not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
            later.append(
                Decision(j.id, False, Reason.BackoffAfterFailure, f"retry backoff until {until}")
            )
        else:
            eligible.append(j)
    decisions: list[Decision] = []
    admitted = 0
    if eligible:  # else nothing to place: no working copy of the inventory to build
        # 2 snapshot; free capacity owed to Isthmus jobs already queued in a backend is held
        index = CapacityIndex(inventory)
        for pool in index.pools.values():
            hold_backend_queue(pool, params.placement.hold_queued_by_shape)
        share = FairShare(quotas, usage)
        limits = ConcurrencyState(concurrency) if concurrency is not None \
            and concurrency.any_admission_limit else None
        shares = QueueShares(quotas, usage) if queue_share.configured(quotas) else None
        cycle = _Cycle(index, QuotaState(quotas, usage), share, now, params, preemptor, limits,
                       shares)
        # 3 nominate happens lazily per job shape inside the cycle; 4 order
        queue = FairQueue(eligible, share, now, params.ordering)
        # 5 admit
        position = 0
        while (job := queue.pop()) is not None:
            decisions.append(cycle.decide(job, position))
            queue.done(job.team)
            position += 1
        admitted = cycle.admitted
    # 6 requeue: waiting decisions carry their reasons; backoff and budget ones come last
    decisions.extend(later)
    if demoted:
        decisions = [replace(d, message=f"{d.message}; {demoted[d.job_id]}",
                             demoted=demoted[d.job_id])
                     if d.job_id in demoted else d for d in decisions]
    counts = Counter(d.reason.value for d in decisions)
    record = CycleRecord(
        at=now,
        inputs_digest=inputs_digest(jobs, inventory, usage, now),
        pending=len(jobs),
        admitted=admitted,
        waiting=len(decisions) - admitted,
        reasons=tuple(sorted(counts.items())),
        admitted_to=tuple(
            (d.job_id, d.placement.pool) for d in decisions if d.admitted and d.placement
        ),
        reservations=tuple(f"{d.job_id}@{d.reservation}" for d in decisions if d.reservation),
        victims=tuple(v.job_id for d in decisions for v in d.victims),
    )
    return CycleResult(tuple(decisions), record)
