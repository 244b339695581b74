"""The rule that feeds the transition metrics (counts and waits) after every accepted
transition; the metrics themselves live in broker/metrics.py, which knows nothing of rules."""

from __future__ import annotations

from broker.domain import JobState
from broker.metrics import QUEUE_WAIT, TIME_TO_RUNNING, TRANSITIONS
from broker.orchestration.rules import Rule, TransitionContext


class MetricsRule(Rule):
    """After every accepted transition: count it; time waits at the moments they end."""

    def after(self, ctx: TransitionContext) -> None:
        TRANSITIONS.labels(ctx.src.value, ctx.dst.value).inc()
        waited = (ctx.now - ctx.job.created_at).total_seconds()
        if ctx.dst is JobState.ADMITTED and ctx.src is not JobState.ADMITTED:
            QUEUE_WAIT.labels(ctx.job.team).observe(waited)
        elif ctx.dst is JobState.RUNNING and ctx.src is not JobState.RUNNING:
            TIME_TO_RUNNING.labels(ctx.job.team).observe(waited)
