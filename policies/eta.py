"""Queue position and estimated start of every waiting job of one admission cycle.

A projected schedule (policies/eta_schedule.py): the admission loop played forward from what
the backends say (free GPUs now, and when busy GPUs come back: `NodeSnapshot.releases`, from
declared time limits) over the jobs known now. The jobs admitted this cycle hold their nodes
for their predicted run; GPUs owed to work queued in a backend are paid first (as admission
holds them); then, at every later release, starving gangs (oldest first) and the other waiting
jobs in the cycle's admission order each start where their gang fits in one domain at its
required level, and a starving gang that does not fit holds a domain for that step. Jobs
submitted later are not known and not projected, so a later job with a better place in the
order can still move a start back.

Run times: with a `RuntimeModel` (policies/run_length.py, learnt from ended attempts) a job runs
its predicted time and running work whose start and limit are known (`Running`) ends at its
predicted end; a waiting job the model cannot speak for runs its declared time scaled by
`runtime_factor` (1.0 trusts declared limits). A release nobody claims (work whose start is not
known) is expected when the backend announces it: scaling the time left to it by a run/declared
ratio would put it a fixed share of the way there, a point that moves on with every cycle and
is never reached (the receding estimate of issue 31).

Window: the projection is played again with every run at a low and at a high quantile of its
group's run/declared ratios (`Spread`); the two starts, stretched away from now by what
bench/eta_accuracy.py measured (the order moves under a waiting job, which no run length
shows), give each start that waits for releases a window (`Estimate.window`) with its stated
coverage (docs/benchmarks.md; how it was chosen: "Issue 31 (2026-12-05)" in
docs/benchmarks/history/2026-11-29..12-05.md). Without a model that speaks there is no spread
to project and no window.

Methods (`Estimate.method`), named so a user knows what the time rests on:
  now            the gang fits now; it waits only for the next cycle (or its backend queue)
  releases       from the expected releases of running work and the run times of the jobs
                 ahead (how those were found is named after it)
  preemption     its victims are being stopped; it starts once they have
  unknown        no estimate; the method says why (quota, drained or unavailable pools, no
                 release data for busy GPUs, beyond the horizon)

Pure: the same cycle result, snapshot and model give the same estimates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason
from broker.domain.topology import rank_of
from policies.cycle import Decision
from policies.eta_schedule import PoolState, Projection, Slot, Start, Wanted
from policies.ordering import OrderingParams
from policies.run_length import Ratios, RuntimeModel
from policies.types import PendingJob

MAX_ESTIMATED = 500
"""Jobs past this place in the queue get no estimate: the projection is linear in the queue."""
MAX_WORK = 400_000
"""Node checks one estimate pass may make (deterministic, unlike a time budget); jobs not
reached when it is spent get no estimate."""
HORIZON_S = 60 * 86400
"""Starts further away than this are reported as unknown rather than as a date."""
MATCH_S = 300.0
"""A release within this of a running attempt's declared end on the same node is that one's."""
_SCHEDULABLE = frozenset({
    Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable, Reason.HigherPriorityAhead,
    Reason.FairShareBehind, Reason.WaitingForAdmission, Reason.BackoffAfterFailure,
})
"""Decision reasons for which capacity alone decides when the job starts."""
_POOL_USABLE = frozenset({Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable})


@dataclass(frozen=True, slots=True)
class Spread:
    """The run-length quantiles a start's window is projected at, how far the window is
    stretched beyond them, and the share of real starts measured to fall inside such windows
    (the stated coverage)."""

    low_q: float
    high_q: float
    coverage: float
    point_q: float | None = None
    """The quantile of the point estimate (None: the mean run of the group)."""
    early_stretch: float = 1.0
    """The window opens at now + this x (the low projection's start - now)."""
    late_stretch: float = 1.0
    """The window closes at now + this x (the high projection's start - now)."""


SPREAD = Spread(low_q=0.1, high_q=0.9, coverage=0.8, early_stretch=0.6, late_stretch=1.5)
"""Chosen on bench/eta_accuracy.py's seeds 3, 5 and 7 (seeds 8, 9 and 11 held out;
docs/benchmarks/history/2026-11-29..12-05.md, "Issue 31 (2026-12-05)"). Run lengths alone
left a fifth of the starts late (the projection does not know the jobs submitted later that the
order puts ahead), hence the stretch of the late end: with the 0.1-0.9 quantiles alone, 63-67%
of the real starts fell inside."""


@dataclass(frozen=True, slots=True)
class Window:
    """The start is expected in [earliest, latest] with the stated `coverage` (0..1)."""

    earliest: datetime
    latest: datetime
    coverage: float


@dataclass(frozen=True, slots=True)
class Estimate:
    job_id: str
    position: int
    """1-based place among the waiting jobs, in admission order (0: not ordered, in backoff)."""
    team_position: int
    """1-based place among its team's waiting jobs."""
    at: datetime | None
    """Earliest estimated start; None when not known (see `method`)."""
    method: str
    pool: str | None = None
    nodes: tuple[str, ...] = ()
    """The nodes the projection gave it in `pool`, one entry per replica (empty without a
    date)."""
    window: Window | None = None
    """Where the start is likely to fall (None: no date, a start now, or no run-time spread)."""


@dataclass(frozen=True, slots=True)
class Running:
    """Work running on a node whose declared end and predicted end are known (the broker's own
    attempts): its release at `declared_end` is expected at `predicted_end` instead."""

    node: str
    declared_end: datetime
    predicted_end: datetime
    early_end: datetime | None = None
    """Its end at the window's low quantile (None: the predicted end)."""
    late_end: datetime | None = None
    """Its end at the window's high quantile (None: the predicted end)."""


def running(node: str, started: datetime, declared_s: float, team: str, gpus: int,
            model: RuntimeModel, now: datetime, spread: Spread = SPREAD) -> Running:
    """Running work as the estimate sees it: declared end (start + limit, as the backends
    announce the release) and its predicted ends (start + the run the model predicts given
    the time it has run, at least a second from now)."""
    return running_at(node, running_ends(started, declared_s, team, gpus, model, now, spread),
                      now)


@dataclass(frozen=True, slots=True)
class RunningEnds:
    """One running attempt's ends while its `ratios` hold (`Ratios.covers` the time it has
    run): they do not move from cycle to cycle, so a caller may keep them."""

    ratios: Ratios
    declared_end: datetime
    ends: tuple[datetime, datetime, datetime]
    """Start + its predicted run: the point, the window's early and late ends."""

    def clamped(self, now: datetime) -> bool:
        """Whether an end is less than a second away (it is then `now` + 1 s)."""
        return min(self.ends) < now + _SECOND


_SECOND = timedelta(seconds=1)


def running_ends(started: datetime, declared_s: float, team: str, gpus: int,
                 model: RuntimeModel, now: datetime, spread: Spread = SPREAD) -> RunningEnds:
    """The ends of work started at `started`, predicted from what ran longer than it has
    by `now`."""
    ratios = model.ratios_at(team, declared_s, (now - started).total_seconds(), gpus,
                             (spread.point_q, spread.low_q, spread.high_q))
    declared = max(1.0, declared_s)
    point, low, high = (started + timedelta(seconds=m * declared) for m in ratios.ratios)
    return RunningEnds(ratios, started + timedelta(seconds=declared_s), (point, low, high))


def running_at(node: str, ends: RunningEnds, now: datetime) -> Running:
    """The work on `node` at `now`, from its kept ends (`running_ends`)."""
    soonest = now + _SECOND
    point, low, high = (max(e, soonest) for e in ends.ends)
    return Running(node, ends.declared_end, point, low, high)


_POINT, _EARLY, _LATE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Runs:
    """How long things run, as far as one projection of this pass knows."""

    factor: float
    model: RuntimeModel | None
    q: float | None = None
    """The run-length quantile of this projection (None: the mean)."""
    which: int = _POINT

    @property
    def speaks(self) -> bool:
        return self.model is not None and self.model.samples >= self.model.min_samples

    def run_s(self, job: PendingJob) -> float:
        if self.model is not None and self.speaks:
            return self.model.run_s(job.team, job.max_runtime_s, job.total_gpus, self.q)
        return max(1.0, self.factor * job.max_runtime_s)

    def with_quantile(self, q: float | None, which: int) -> _Runs:
        return _Runs(self.factor, self.model, q, which)

    def label(self) -> str:
        if self.model is not None and self.speaks:
            return f" (run times from {self.model.samples} ended attempts)"
        return "" if self.factor == 1.0 else f" x{self.factor:.2f} (observed run/declared)"


def estimate(
    decisions: Sequence[Decision],
    jobs: Mapping[str, PendingJob],
    inventory: InventorySnapshot,
    now: datetime,
    max_estimated: int = MAX_ESTIMATED,
    runtime_factor: float = 1.0,
    model: RuntimeModel | None = None,
    running: Sequence[Running] = (),
    ordering: OrderingParams | None = None,
    spread: Spread | None = SPREAD,
) -> dict[str, Estimate]:
    """Position, estimated start and its window of every waiting decision (admitted ones get
    none)."""
    if all(d.admitted for d in decisions):
        return {}  # nobody waits: nothing to project
    runs = _Runs(min(1.0, max(0.01, runtime_factor)), model,
                 spread.point_q if spread is not None else None)
    ordering = ordering or OrderingParams()
    shape = _shape(inventory, running)
    point = _project(decisions, jobs, shape, now, max_estimated, runs, ordering)
    if spread is None or not runs.speaks or spread.low_q == spread.point_q == spread.high_q \
            or not any(e.at is not None and e.method.startswith("releases")
                       for e in point.values()):
        return point  # no window to give: the two projections would be spent for nothing
    early = _project(decisions, jobs, shape, now, max_estimated,
                     runs.with_quantile(spread.low_q, _EARLY), ordering)
    late = _project(decisions, jobs, shape, now, max_estimated,
                    runs.with_quantile(spread.high_q, _LATE), ordering)
    return {k: _windowed(e, early.get(k), late.get(k), spread, now)
            for k, e in point.items()}


def _windowed(e: Estimate, early: Estimate | None, late: Estimate | None, spread: Spread,
              now: datetime) -> Estimate:
    """`e` with the window its two other projections give, stretched (the greedy loop is not
    monotone in run times, so the window is widened to hold the point)."""
    if e.at is None or not e.method.startswith("releases") or early is None \
            or late is None or early.at is None or late.at is None:
        return e
    lo, hi = min(early.at, e.at, late.at), max(early.at, e.at, late.at)
    lo = min(e.at, now + max(timedelta(0), lo - now) * spread.early_stretch)
    hi = max(e.at, now + max(timedelta(0), hi - now) * spread.late_stretch)
    return replace(e, window=Window(lo, hi, spread.coverage))


_Ends = tuple[float, float, float]
"""Predicted, early and late end of running work (epoch seconds)."""


@dataclass(frozen=True, slots=True)
class _Shape:
    """The snapshot as every projection of one pass starts from it, read once per pass: the
    schedulable nodes of each pool (whether some of its busy GPUs have no known end), and
    every release in snapshot order with the ends of the running work it is matched to."""

    pools: tuple[tuple[str, tuple[tuple[str, int, int, tuple[str, str, str, str]], ...], bool],
                 ...]
    releases: tuple[tuple[float, _Ends | None, str, str, int], ...]
    """(announced time, matched work's ends or None, pool, node, GPUs)."""
    backlog: tuple[tuple[str, int], ...]
    """GPUs of Isthmus jobs pending in each pool's backend queue, where there are any."""


def _shape(inventory: InventorySnapshot, running: Sequence[Running]) -> _Shape:
    ends: dict[str, list[tuple[float, _Ends]]] = {}
    for r in running:
        predicted = r.predicted_end.timestamp()
        ends.setdefault(r.node, []).append((r.declared_end.timestamp(), (
            predicted, r.early_end.timestamp() if r.early_end else predicted,
            r.late_end.timestamp() if r.late_end else predicted)))
    pools: list[tuple[str, tuple[tuple[str, int, int, tuple[str, str, str, str]], ...], bool]] \
        = []
    releases: list[tuple[float, _Ends | None, str, str, int]] = []
    for p in inventory.pools:
        slots: list[tuple[str, int, int, tuple[str, str, str, str]]] = []
        unknown_busy = False
        for n in p.nodes:
            if not n.schedulable or n.total_gpus <= 0:
                continue
            t = n.topology
            free = max(0, min(n.free_gpus, n.total_gpus))
            slots.append((n.name, n.total_gpus, free,
                          (n.name, f"{t.block}/{t.rack}", t.block or "", "")))
            released = 0
            for at, gpus in n.releases:
                if gpus > 0:
                    ts = at.timestamp()
                    # a release within MATCH_S of a running attempt's declared end is its
                    matched = next((e for declared, e in ends.get(n.name, ())
                                    if abs(declared - ts) <= MATCH_S), None)
                    releases.append((ts, matched, p.name, n.name, gpus))
                    released += gpus
            unknown_busy = unknown_busy or free + released < n.total_gpus
        pools.append((p.name, tuple(slots), unknown_busy))
    backlog = tuple((p.name, p.queue.isthmus_pending_gpus) for p in inventory.pools
                    if p.queue.isthmus_pending_gpus > 0)
    return _Shape(tuple(pools), tuple(releases), backlog)


def _project(decisions: Sequence[Decision], jobs: Mapping[str, PendingJob],
             shape: _Shape, now: datetime, max_estimated: int, runs: _Runs,
             ordering: OrderingParams) -> dict[str, Estimate]:
    """One projection of the queue with run times as `runs` tells them."""
    t_now = _ts(now)
    pools = {name: PoolState(name, [Slot(*a) for a in slots], busy)
             for name, slots, busy in shape.pools}
    proj = Projection(pools, t_now, HORIZON_S, ordering.max_reservations, [MAX_WORK])
    which = runs.which
    for at, matched, pool, node, gpus in shape.releases:
        # expected at the matched work's predicted end, else when announced
        proj.release(max(t_now, at if matched is None else matched[which]), pool, node, gpus)
    _admitted(decisions, jobs, shape, proj, runs)
    waiting = sorted((d for d in decisions if not d.admitted),
                     key=lambda d: (d.position < 0, d.position))
    wanted: dict[str, Wanted] = {}
    early: dict[str, tuple[datetime | None, str]] = {}
    for i, d in enumerate(waiting, start=1):
        w, why = _wanted(d, jobs.get(d.job_id), i > max_estimated, t_now, runs, ordering)
        if w is None:
            early[d.job_id] = why
        else:
            wanted[d.job_id] = w
    starts = proj.run(list(wanted.values()))
    return _results(waiting, jobs, early, wanted, starts, proj, runs)


def _admitted(decisions: Sequence[Decision], jobs: Mapping[str, PendingJob],
              shape: _Shape, proj: Projection, runs: _Runs) -> None:
    """This cycle's admissions hold their nodes; those queued in a backend (no nodes yet), and
    the Isthmus GPUs the backends already have pending, are owed GPUs paid first. Pending
    backend GPUs are known by their number only: they run the median run of this cycle's
    jobs."""
    known = sorted(runs.run_s(j) for j in jobs.values())
    typical = known[len(known) // 2] if known else runs.factor * 3600.0
    for name, gpus in shape.backlog:
        pool = proj.pools.get(name)
        if pool is not None:
            pool.owed.append((gpus, typical))
    for d in decisions:
        job = jobs.get(d.job_id)
        if not (d.admitted and d.placement) or job is None:
            continue
        pool = proj.pools.get(d.placement.pool)
        if pool is None:
            continue
        if not d.placement.nodes:
            pool.owed.append((job.total_gpus, runs.run_s(job)))
            continue
        picked = [(pool.slots[n], 1) for n in d.placement.nodes if n in pool.slots]
        proj.take(proj.now, runs.run_s(job), pool, job.gpus_per_replica, picked)


def _wanted(
    d: Decision, job: PendingJob | None, beyond: bool, now: float, runs: _Runs,
    ordering: OrderingParams,
) -> tuple[Wanted | None, tuple[datetime | None, str]]:
    """The job as the projection sees it, or its estimate when it gets no date."""
    if job is None:
        return None, (None, "unknown: no admission view")
    if d.reason == Reason.WaitingForPreemption:
        return None, (_dt(now), "preemption")
    if d.reason not in _SCHEDULABLE:
        return None, (None, f"unknown: waits for {d.reason.value}, not for capacity")
    if beyond:
        return None, (None, f"unknown: beyond the first {MAX_ESTIMATED} jobs of the queue")
    usable = [v.pool for v in d.verdicts if (v.fits or v.reason in _POOL_USABLE)]
    rank = {f: i for i, f in enumerate(job.flavors)}
    flavor = {v.pool: v.flavor for v in d.verdicts}
    pools = tuple(sorted(usable, key=lambda p: (rank.get(flavor.get(p) or "", 99), p)))
    submitted = _ts(job.submitted_at)
    if d.reservation is not None:
        starving = now
    elif job.total_gpus >= ordering.reservation_min_gpus:
        starving = submitted + ordering.starvation_after_s
    else:
        starving = math.inf
    not_before = _ts(job.not_before) if job.not_before is not None else now
    return Wanted(job.id, job.gpus_per_replica, job.replicas, rank_of(job.topology_required),
                  runs.run_s(job), pools, not_before, starving, submitted,
                  job.exclude_nodes, float(job.max_runtime_s)), (None, "")


def _results(
    waiting: Sequence[Decision], jobs: Mapping[str, PendingJob],
    early: Mapping[str, tuple[datetime | None, str]], wanted: Mapping[str, Wanted],
    starts: Mapping[str, Start], proj: Projection, runs: _Runs,
) -> dict[str, Estimate]:
    out: dict[str, Estimate] = {}
    per_team: dict[str, int] = {}
    for i, d in enumerate(waiting, start=1):
        job = jobs.get(d.job_id)
        team = job.team if job else ""
        per_team[team] = per_team.get(team, 0) + 1
        position = i if d.position >= 0 else 0
        s = starts.get(d.job_id)
        if d.job_id in early:
            at, method = early[d.job_id]
            out[d.job_id] = Estimate(d.job_id, position, per_team[team], at, method)
        elif s is not None:
            method = "now" if s.at <= proj.now else f"releases{runs.label()}"
            out[d.job_id] = Estimate(d.job_id, position, per_team[team], _dt(s.at), method,
                                     s.pool, s.nodes)
        else:
            why = _why_none(wanted[d.job_id], proj)
            out[d.job_id] = Estimate(d.job_id, position, per_team[team], None, why)
    return out


def _why_none(w: Wanted, proj: Projection) -> str:
    if proj.budget[0] <= 0:
        return "unknown: the estimate's work budget for this cycle is spent"
    if any(p in proj.pools and proj.pools[p].unknown_busy for p in w.pools):
        return "unknown: busy GPUs without a known end"
    return f"unknown: no fit within {HORIZON_S // 86400} days"


def _ts(at: datetime) -> float:
    return at.timestamp()


def _dt(t: float) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=t)
