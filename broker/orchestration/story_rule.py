"""The rule that tells the log what happened to each job: one INFO line per accepted change of
state, written once the transaction that made it committed (a transaction rolled back tells
nothing; a change undone only by a savepoint inside a transaction that commits is still told).
A change of reason alone (a job that keeps waiting, for a new reason) is DEBUG: the INFO log
reads as the story of the jobs, not of the cycles that looked at them."""

from __future__ import annotations

import logging

from sqlalchemy import event
from sqlalchemy.orm import Session

from broker.logs import get_logger
from broker.orchestration.rules import Rule, TransitionContext

log = get_logger("orchestration.story")
_KEY = "isthmus_story"


class StoryRule(Rule):
    def after(self, ctx: TransitionContext) -> None:
        level = logging.INFO if ctx.src is not ctx.dst else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        job = ctx.job
        line = (f"job {job.id} ({job.name}, team {job.team}, attempt {job.attempt}): "
                f"{ctx.src.value} -> {ctx.dst.value} ({ctx.reason.value}): {ctx.message}")
        ctx.session.info.setdefault(_KEY, []).append((level, line))


@event.listens_for(Session, "after_commit")
def _tell(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint released: nothing is committed yet
    for level, line in session.info.pop(_KEY, ()):
        log.log(level, "%s", line)


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_KEY, None)
