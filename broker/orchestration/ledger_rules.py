"""Rules that keep the quota ledger in step with the lifecycle.

Admission (QUEUED -> ADMITTED) must carry the reservation the admission cycle decided, in
`cause.details["reservation"]` = {"flavor", "gpus", "borrowed_gpus"}; the reservation is
written once the transition is accepted. Leaving the admitted states by any path (requeue,
retry, failure, success, cancel) releases the attempt's reservation.
"""

from __future__ import annotations

from broker import ledger
from broker.domain import HOLDING, JobState, Reason
from broker.orchestration.rules import Outcome, Rule, Ruling, TransitionContext

S = JobState


class ReserveOnAdmission(Rule):
    from_states = frozenset({S.QUEUED})
    to_states = frozenset({S.ADMITTED})

    def before(self, ctx: TransitionContext) -> Ruling | None:
        spec = (ctx.cause.details or {}).get("reservation")
        if not isinstance(spec, dict) or not {"flavor", "gpus"} <= set(spec):
            return Ruling(
                Outcome.ABORT, Reason.TransitionNotAllowed,
                "admission must carry the reservation (flavor, gpus) it decided",
            )
        ctx.scratch["reservation"] = spec
        return None

    def after(self, ctx: TransitionContext) -> None:
        spec = ctx.scratch["reservation"]
        ledger.reserve(
            ctx.session,
            ledger.Reservation(
                job_id=ctx.job.id, attempt=ctx.job.attempt, team=ctx.job.team,
                flavor=str(spec["flavor"]), gpus=int(spec["gpus"]),
                borrowed_gpus=int(spec.get("borrowed_gpus", 0)),
            ),
            ctx.now,
            note=ctx.cause.actor,
        )


class ReleaseOnLeave(Rule):
    from_states = HOLDING
    to_states = frozenset({S.QUEUED, S.RETRYING, S.FAILED, S.SUCCEEDED, S.CANCELLED})

    def after(self, ctx: TransitionContext) -> None:
        ledger.release(ctx.session, ctx.job.id, ctx.job.attempt, ctx.now, note=ctx.dst.value)
