"""The rule that writes a job's notices: after an accepted change that tells something
(broker.domain.notices.kind_of), one row in the notices outbox, in the transaction of the
change. A crash before the commit loses both the change and its notice; after it, the leader's
delivery pass finds the notice. The key (job, event seq) makes it one notice per event.

Only jobs that may have subscribers get rows: a job whose spec has `notify:`, or a job of a
team with `teams[].notices` in a configuration this process loaded (`watch_teams`, called by
the wiring). That set is a filter, not the routing: delivery resolves the targets from the
configuration again, so a team watched by an earlier configuration of the same process costs
a row that resolves to nobody, never a wrong delivery.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.domain import JobState
from broker.domain.notices import NoticeKind, kind_of
from broker.domain.spec import JobSpec
from broker.orchestration.rules import Rule, Ruling, TransitionContext
from broker.store import notices
from broker.store.records import JobRecord

_WATCHED_TEAMS: set[str] = set()
_OLD_REASON = "notice_old_reason"


def watch_teams(names: Iterable[str]) -> None:
    """Teams with notices in a configuration this process runs (only ever grows)."""
    _WATCHED_TEAMS.update(names)


def may_notify(job: JobRecord) -> bool:
    return job.team in _WATCHED_TEAMS or '"notify":{' in job.spec_json


def _grace(spec_json: str) -> int | None:
    try:  # parsed whole only here: preemptions are rare beside the transitions
        return int(JobSpec.model_validate_json(spec_json).checkpoint.grace)
    except ValueError:
        return None


class NoticeRule(Rule):
    def before(self, ctx: TransitionContext) -> Ruling | None:
        ctx.scratch[_OLD_REASON] = ctx.job.reason
        return None

    def after(self, ctx: TransitionContext) -> None:
        job = ctx.job
        kind = kind_of(ctx.src, ctx.dst, ctx.scratch.get(_OLD_REASON, ""), ctx.reason)
        if kind is None or not may_notify(job):
            return
        details: dict[str, object] = {"attempt": job.attempt}
        if kind is NoticeKind.preempted and ctx.dst is JobState.RETRYING:
            # The stop signal went out in this pass (broker.control.preempt): the whole grace
            # of the spec is left when the change commits.
            details["grace_left_s"] = _grace(job.spec_json)
        notices.add(ctx.session, key=f"job:{job.id}:{job.last_seq}", kind=kind.value,
                    team=job.team, at=ctx.now, job_id=job.id, event_seq=job.last_seq,
                    details=details)
