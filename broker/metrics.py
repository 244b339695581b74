"""Prometheus metrics, fed from after-transition hooks and from the control loop.

Counters and histograms move when a transition is accepted (an after hook, in the writing
process); gauges of jobs by state and reason are read from the database at scrape time, so
every replica reports the same truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.domain import JobState
from broker.orchestration.rules import Rule, TransitionContext
from broker.store.db import Database
from broker.store.records import JOBS

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
GPU_HOURS = Counter(
    "isthmus_gpu_hours_total", "GPU-hours by team and flavor; kind used or wasted",
    ["team", "flavor", "kind"], registry=REGISTRY,
)
BACKEND_UP = Gauge(
    "isthmus_backend_reachable", "1 when the last call to the backend succeeded",
    ["backend"], registry=REGISTRY,
)
RECONCILE_LAG = Gauge(
    "isthmus_reconcile_lag_seconds", "Age of the newest facts per backend",
    ["backend"], registry=REGISTRY,
)


class MetricsRule(Rule):
    """After every accepted transition: count it; time waits at the moments they end."""

    def after(self, ctx: TransitionContext) -> None:
        TRANSITIONS.labels(ctx.src.value, ctx.dst.value).inc()
        waited = (ctx.now - ctx.job.created_at).total_seconds()
        if ctx.dst is JobState.ADMITTED and ctx.src is not JobState.ADMITTED:
            QUEUE_WAIT.labels(ctx.job.team).observe(waited)
        elif ctx.dst is JobState.RUNNING and ctx.src is not JobState.RUNNING:
            TIME_TO_RUNNING.labels(ctx.job.team).observe(waited)


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
