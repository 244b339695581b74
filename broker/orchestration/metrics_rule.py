"""The rule that feeds the transition metrics (counts and waits) after every accepted
transition; the metrics themselves live in broker/metrics.py, which knows nothing of rules."""

from __future__ import annotations

from typing import Any

from broker.domain import JobState
from broker.metrics import QUEUE_WAIT, TIME_TO_RUNNING, TRANSITIONS
from broker.orchestration.rules import Rule, TransitionContext
from broker.store import batch

# The labelled children, looked up once (`labels` takes a lock and checks its labels on every
# call: most of a count's cost on the batched hot paths). Bounded: states x states, and teams
# from the configuration; emptied should it ever grow past that.
_CHILDREN: dict[tuple[object, ...], Any] = {}
_MAX_CHILDREN = 4096


def _child(metric: Any, *labels: str) -> Any:
    key = (metric, *labels)
    child = _CHILDREN.get(key)
    if child is None:
        if len(_CHILDREN) >= _MAX_CHILDREN:
            _CHILDREN.clear()
        child = _CHILDREN[key] = metric.labels(*labels)
    return child


def _count(src: JobState, dst: JobState, team: str, waited: float) -> None:
    _child(TRANSITIONS, src.value, dst.value).inc()
    if dst is JobState.ADMITTED and src is not JobState.ADMITTED:
        _child(QUEUE_WAIT, team).observe(waited)
    elif dst is JobState.RUNNING and src is not JobState.RUNNING:
        _child(TIME_TO_RUNNING, team).observe(waited)


class MetricsRule(Rule):
    """After every accepted transition: count it; time waits at the moments they end. In a
    batch of writes (broker.store.batch) the count waits until the batch is written, so a
    batch that fails and is done job by job counts each transition once."""

    def after(self, ctx: TransitionContext) -> None:
        src, dst, team = ctx.src, ctx.dst, ctx.job.team
        waited = (ctx.now - ctx.job.created_at).total_seconds()
        batch.after(ctx.session, lambda: _count(src, dst, team, waited))
