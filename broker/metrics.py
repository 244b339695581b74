"""Prometheus metrics, fed from after-transition hooks and from the control loop.

Counters and histograms move where things happen (an accepted transition, an attempt booked in
the ledger, a reconcile pass), in the process that did it: the leader, for the control loop's.
Gauges of the federation's state (jobs by state, GPUs allocated and idle, queue age, borrowed
GPUs, the lease, ledger drift) are read from the database at scrape time, so every replica
reports the same truth. Names use base units (GPU-seconds, not GPU-hours) so that
`promtool check metrics` passes; `tests/deploy/test_prometheus.py` runs it on /metrics.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker import ledger
from broker.config import IsthmusConfig
from broker.domain import JobState
from broker.domain.facts import Fact
from broker.policy_inputs import budget_periods, budget_windows, budgets
from broker.store import budget_usage
from broker.store.attempts import ATTEMPTS
from broker.store.db import Database
from broker.store.db_clock import db_now
from broker.store.records import JOBS
from broker.store.tables import LEASES
from policies.budgets import crossed

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

REGISTRY = CollectorRegistry(auto_describe=True)
TRANSITIONS = Counter(
    "isthmus_transitions_total", "Accepted state transitions", ["from_state", "to_state"],
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "isthmus_queue_wait_seconds", "Submission to admission, per admission",
    ["team"], buckets=WAIT_BUCKETS, registry=REGISTRY,
)
TIME_TO_RUNNING = Histogram(
    "isthmus_time_to_running_seconds", "Submission to every rank running",
    ["team"], buckets=WAIT_BUCKETS, registry=REGISTRY,
)
TIME_TO_USEFUL_WORK = Histogram(
    "isthmus_time_to_useful_work_seconds", "Submission to the first progress report",
    ["team"], buckets=WAIT_BUCKETS, registry=REGISTRY,
)
ADMISSION_CYCLE = Histogram(
    "isthmus_admission_cycle_seconds", "Duration of one admission cycle",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10), registry=REGISTRY,
)
GPU_SECONDS = Counter(
    "isthmus_gpu_seconds_total", "GPU-seconds held by ended attempts, as booked in the ledger "
    "(kind used: all of it; kind wasted: the part that bought nothing)",
    ["team", "flavor", "kind"], registry=REGISTRY,
)
WASTED = Counter(
    "isthmus_gpu_wasted_seconds_total", "Wasted GPU-seconds by kind: preparing, failed, lost "
    "(since the last progress report), preempted, cancelled",
    ["team", "flavor", "pool", "kind"], registry=REGISTRY,
)
COST = Counter(
    "isthmus_gpu_cost_total", "Cost of the GPU-hours used: hours x flavor x pool cost weight",
    ["team", "flavor", "pool"], registry=REGISTRY,
)
AUDIT_FAILED = Counter(
    "isthmus_audit_records_failed_total", "Audit records that could not be written (the call "
    "they record was done and answered; the error is logged with its request id)",
    registry=REGISTRY,
)
FAILURES = Counter(
    "isthmus_attempt_failures_total", "Attempts that failed or were lost, by failure category "
    "and pool; oom=\"true\" when the backend reported an out-of-memory kill",
    ["category", "pool", "oom"], registry=REGISTRY,
)
BACKEND_UP = Gauge(
    "isthmus_backend_reachable", "1 when the last call to the backend succeeded",
    ["backend"], registry=REGISTRY,
)
RECONCILE_LAG = Gauge(
    "isthmus_reconcile_lag_seconds", "Age of the newest facts per backend (set by the leader's "
    "reconciler on every pass; grows while the backend cannot be observed)",
    ["backend"], registry=REGISTRY,
)

IDLE_AFTER = timedelta(minutes=15)
"""A running attempt with no progress report (nor start) for this long counts as idle."""


def charged(team: str, flavor: str, pool: str, hours: dict[ledger.LedgerKind, float],
            weight: float) -> None:
    """Count what `ledger.charge` booked for one attempt."""
    used = hours.get(ledger.LedgerKind.USAGE, 0.0)
    GPU_SECONDS.labels(team, flavor, "used").inc(used * 3600)
    COST.labels(team, flavor, pool).inc(used * weight)
    wasted = 0.0
    for kind, value in hours.items():
        if kind in ledger.WASTE_KINDS:
            WASTED.labels(team, flavor, pool, kind.value.removeprefix("waste:")).inc(value * 3600)
            wasted += value
    GPU_SECONDS.labels(team, flavor, "wasted").inc(wasted * 3600)


def is_oom(fact: Fact) -> bool:
    """The backends name an out-of-memory kill in their raw state or reason (Slurm
    OUT_OF_MEMORY, Kubernetes OOMKilled); the category alone (USER_ERROR or RESOURCE_ENV, by
    site policy) does not say it."""
    text = f"{fact.raw_state} {fact.raw_reason} {fact.message}".lower()
    return "oom" in text or "out_of_memory" in text or "out of memory" in text


class ReconcileLag:
    """The newest facts of each backend and when they were seen; the reconciler reports here."""

    def __init__(self) -> None:
        self._newest: dict[str, datetime] = {}

    def observed(self, backend: str, now: datetime, newest: datetime | None) -> None:
        """A successful observe: the facts are as new as their newest observation (`newest`;
        None, or now, for a backend with nothing of ours)."""
        newest = now if newest is None else newest
        self._newest[backend] = min(newest, now)
        RECONCILE_LAG.labels(backend).set(0.0 if newest >= now
                                          else (now - newest).total_seconds())

    def failed(self, backend: str, now: datetime) -> None:
        """No facts this pass: the newest ones age (counted from the first failure when this
        process never observed the backend)."""
        newest = self._newest.setdefault(backend, now)
        RECONCILE_LAG.labels(backend).set(max(0.0, (now - newest).total_seconds()))


LAG = ReconcileLag()


class JobsByState(Collector):
    """isthmus_jobs{state, reason}: read from the database at scrape time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("isthmus_jobs", "Jobs by state and reason",
                                   labels=["state", "reason"])
        with self.db.read() as s:
            rows = s.connection().execute(
                sa.select(JOBS.c.state, JOBS.c.reason, sa.func.count())
                .group_by(JOBS.c.state, JOBS.c.reason)
            )
            for state, reason, n in rows:
                family.add_metric([state, reason], float(n))
        yield family


class FederationState(Collector):
    """Gauges of the federation's state, read from the database at scrape time (cached for
    `ttl` seconds, the ledger drift for `drift_ttl`: it scans the whole ledger)."""

    def __init__(self, db: Database, ttl: float = 10.0, drift_ttl: float = 300.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db, self.ttl, self.drift_ttl, self.clock = db, ttl, drift_ttl, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[GaugeMetricFamily]] = (-1e18, [])
        self._drift: tuple[float, GaugeMetricFamily | None] = (-1e18, None)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = time.monotonic()
            if now - self._cached[0] > self.ttl:
                self._cached = (now, self._read())
            if now - self._drift[0] > self.drift_ttl or self._drift[1] is None:
                self._drift = (now, self._read_drift())
            families = [*self._cached[1], self._drift[1]]
        yield from families

    def _read(self) -> list[GaugeMetricFamily]:
        now = self.clock()
        with self.db.read() as s:
            conn = s.connection()
            live = conn.execute(
                sa.select(JOBS.c.team, ATTEMPTS.c.pool, JOBS.c.state, ATTEMPTS.c.gpus,
                          ATTEMPTS.c.last_progress_at, ATTEMPTS.c.started_at,
                          ATTEMPTS.c.dispatched_at)
                .join(ATTEMPTS, sa.and_(ATTEMPTS.c.job_id == JOBS.c.id,
                                        ATTEMPTS.c.number == JOBS.c.attempt))
                .where(JOBS.c.state.in_([JobState.PREPARING.value, JobState.RUNNING.value]),
                       ATTEMPTS.c.ended_at.is_(None))
            ).all()
            waiting = conn.execute(
                sa.select(JOBS.c.team, JOBS.c.created_at, JOBS.c.total_gpus, JOBS.c.spec_json)
                .where(JOBS.c.state == JobState.QUEUED.value)
            ).all()
            usage = ledger.usage(s)
            lease = conn.execute(sa.select(LEASES.c.epoch, LEASES.c.expires_at)).first()
        return [*_held_families(live, now), *_queue_families(waiting, now),
                *_ledger_families(usage), *_lease_families(lease, now)]

    def _read_drift(self) -> GaugeMetricFamily:
        drift = GaugeMetricFamily(
            "isthmus_ledger_drift", "Ledger inconsistencies: check=quota counts (team, flavor) "
            "counters that differ from their entries; check=uncharged counts ended attempts "
            "whose backend object existed and that have no usage entry", labels=["check"])
        with self.db.snapshot() as s:  # counters and entries of one moment
            mismatches = len(ledger.check(s))
            uncharged = ledger.uncharged_attempts(s)
        drift.add_metric(["quota"], float(mismatches))
        drift.add_metric(["uncharged"], float(uncharged))
        return drift


def _held_families(live: Sequence[Any], now: datetime) -> list[GaugeMetricFamily]:
    """GPUs held by live attempts, and those of running jobs that report nothing."""
    allocated = GaugeMetricFamily(
        "isthmus_gpus_allocated", "GPUs held by the current attempts of PREPARING and "
        "RUNNING jobs", labels=["team", "pool", "state"])
    idle = GaugeMetricFamily(
        "isthmus_gpus_idle", f"GPUs of RUNNING jobs with no progress report (nor start) "
        f"for {int(IDLE_AFTER.total_seconds() // 60)} minutes", labels=["team", "pool"])
    cutoff = now - IDLE_AFTER
    alloc: dict[tuple[str, str, str], int] = {}
    idle_by: dict[tuple[str, str], int] = {}
    for team, pool, state, gpus, progress, started, dispatched in live:
        alloc[(team, pool, state)] = alloc.get((team, pool, state), 0) + gpus
        last = _as_utc(progress or started or dispatched)
        if state == JobState.RUNNING.value and last is not None and last < cutoff:
            idle_by[(team, pool)] = idle_by.get((team, pool), 0) + gpus
        else:
            idle_by.setdefault((team, pool), 0)
    for key, n in sorted(alloc.items()):
        allocated.add_metric(list(key), float(n))
    for (team, pool), n in sorted(idle_by.items()):
        idle.add_metric([team, pool], float(n))
    return [allocated, idle]


def _queue_families(waiting: Sequence[Any], now: datetime) -> list[GaugeMetricFamily]:
    """The oldest QUEUED job's age and the queued GPUs, per team and first flavor."""
    oldest = GaugeMetricFamily(
        "isthmus_queue_oldest_age_seconds", "Age of the oldest QUEUED job per team and "
        "first acceptable flavor ('any' when given by constraints)",
        labels=["team", "flavor"])
    queued = GaugeMetricFamily(
        "isthmus_queued_gpus", "GPUs asked for by QUEUED jobs", labels=["team", "flavor"])
    first: dict[tuple[str, str], datetime] = {}
    gpus_by: dict[tuple[str, str], int] = {}
    for team, created, gpus, spec_json in waiting:
        wkey = (str(team), _first_flavor(spec_json))
        since = _as_utc(created) or now
        first[wkey] = min(first.get(wkey, since), since)
        gpus_by[wkey] = gpus_by.get(wkey, 0) + gpus
    for wkey in sorted(first):
        oldest.add_metric(list(wkey), max(0.0, (now - first[wkey]).total_seconds()))
        queued.add_metric(list(wkey), float(gpus_by[wkey]))
    return [oldest, queued]


def _ledger_families(usage: dict[tuple[str, str], tuple[int, int]]
                     ) -> list[GaugeMetricFamily]:
    reserved = GaugeMetricFamily(
        "isthmus_gpus_reserved", "GPUs reserved in the quota ledger",
        labels=["team", "flavor"])
    borrowed = GaugeMetricFamily(
        "isthmus_gpus_borrowed", "Reserved GPUs above the team's nominal quota (borrowed "
        "from its cohort)", labels=["team", "flavor"])
    for (team, flavor), (held, lent) in sorted(usage.items()):
        reserved.add_metric([team, flavor], float(held))
        borrowed.add_metric([team, flavor], float(lent))
    return [reserved, borrowed]


def _lease_families(lease: Any, now: datetime) -> list[GaugeMetricFamily]:
    leader = GaugeMetricFamily(
        "isthmus_leader_lease_valid", "1 while some replica holds an unexpired control "
        "lease")
    epoch = GaugeMetricFamily("isthmus_leader_epoch", "Epoch of the control lease")
    expires = _as_utc(lease[1]) if lease is not None else None
    leader.add_metric([], 1.0 if expires is not None and expires > now else 0.0)
    epoch.add_metric([], float(lease[0]) if lease is not None else 0.0)
    return [leader, epoch]


def _as_utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _first_flavor(spec_json: str) -> str:
    try:
        flavors = json.loads(spec_json).get("flavors") or []
        return str(flavors[0]) if flavors else "any"
    except (ValueError, AttributeError, IndexError):
        return "unknown"


class BudgetState(Collector):
    """GPU-hour budgets in their current periods (by the database's clock), read from the
    ledger's daily sums at scrape time (cached for `ttl` seconds): what each allows, what is
    used, and the highest warning fraction reached (0: none; 1: spent). `user` is empty for a
    whole team's budget. Without a budget configured the families are empty and nothing is
    read."""

    def __init__(self, db: Database, config: IsthmusConfig, ttl: float = 10.0,
                 period_clock: Callable[[sa.Connection], datetime] = db_now) -> None:
        self.db, self.config, self.ttl, self.period_clock = db, config, ttl, period_clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[GaugeMetricFamily]] = (-1e18, [])

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = time.monotonic()
            if now - self._cached[0] > self.ttl:
                self._cached = (now, self._read())
            families = self._cached[1]
        yield from families

    def _read(self) -> list[GaugeMetricFamily]:
        configured = budget_periods(self.config)
        used: dict[date, budget_usage.Used] = {}
        now = datetime.now(UTC)
        if configured:
            with self.db.read() as s:
                now = self.period_clock(s.connection())
                used = budget_usage.used_in(s, budget_windows(self.config, now))
        labels = ["team", "user", "period"]
        allowed = GaugeMetricFamily(
            "isthmus_budget_gpu_seconds", "GPU-seconds a budget allows per period", labels=labels)
        spent = GaugeMetricFamily(
            "isthmus_budget_used_gpu_seconds", "GPU-seconds used in the budget's current "
            "period (ledger usage of ended attempts)", labels=labels)
        reached = GaugeMetricFamily(
            "isthmus_budget_threshold_ratio", "The highest warning fraction of the budget "
            "reached in its current period (0: none; 1: spent)", labels=labels)
        for bs in (budgets(self.config, used, now).by_team.values() if configured else ()):
            for b in bs:
                key = [b.team, b.user or "", b.period]
                allowed.add_metric(key, b.gpu_hours * 3600)
                spent.add_metric(key, b.used * 3600)
                marks = crossed(b)
                reached.add_metric(key, marks[-1] if marks else 0.0)
        return [allowed, spent, reached]


STORE_FAMILIES = frozenset({
    "isthmus_jobs", "isthmus_gpus_allocated", "isthmus_gpus_idle",
    "isthmus_queue_oldest_age_seconds", "isthmus_queued_gpus", "isthmus_gpus_reserved",
    "isthmus_gpus_borrowed", "isthmus_leader_lease_valid", "isthmus_leader_epoch",
    "isthmus_ledger_drift", "isthmus_budget_gpu_seconds", "isthmus_budget_used_gpu_seconds",
    "isthmus_budget_threshold_ratio",
})
"""The families the store collectors yield (tests/integration/control/test_metrics.py keeps
this true), for checks that have no database at hand."""


def store_collectors(db: Database, config: IsthmusConfig | None = None) -> list[Collector]:
    """What the API registers for /metrics besides REGISTRY (budgets with a `config`)."""
    out: list[Collector] = [JobsByState(db), FederationState(db)]
    if config is not None:
        out.append(BudgetState(db, config))
    return out
