"""The rule that tells the log what happened to each job: one INFO line per accepted change of
state, once its transaction committed (a rolled-back change is never told). A change of
reason alone (a job that keeps waiting, for a new reason) is DEBUG: the INFO log reads as the
story of the jobs, not of the cycles that looked at them."""

from __future__ import annotations

import logging

from broker.logs import get_logger
from broker.orchestration.rules import Rule, TransitionContext
from broker.store import batch

log = get_logger("orchestration.story")


class StoryRule(Rule):
    def after(self, ctx: TransitionContext) -> None:
        level = logging.INFO if ctx.src is not ctx.dst else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        job, src, dst, reason, message = ctx.job, ctx.src, ctx.dst, ctx.reason, ctx.message
        line = (f"job {job.id} ({job.name}, team {job.team}, attempt {job.attempt}): "
                f"{src.value if src else 'new'} -> {dst.value} ({reason.value}): {message}")
        batch.after(ctx.session, lambda: log.log(level, "%s", line))
