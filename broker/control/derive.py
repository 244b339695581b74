"""Facts of an attempt -> the transitions they imply for its job. Pure.

The reconciler applies the steps in order through set_state; each step is a legal move of the
lifecycle, so a job seen first as RUNNING goes ADMITTED -> PREPARING -> RUNNING, and one seen
first as finished goes through RUNNING before SUCCEEDED (its start time is in the fact).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain import HOLDING, FailureCategory, JobState, Reason
from broker.domain.facts import ENDED_PHASES, Fact, Phase
from broker.domain.reasons import FAILURE_REASON

S = JobState


@dataclass(frozen=True, slots=True)
class Step:
    state: JobState
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Derived:
    steps: tuple[Step, ...] = ()
    ended: bool = False  # the attempt is over in the backend
    failure: FailureCategory | None = None
    preempted: bool = False
    started: bool = False  # every rank ran at some point


def _to_preparing(state: JobState, reason: Reason, msg: str) -> list[Step]:
    return [Step(S.PREPARING, reason, msg)] if state is S.ADMITTED else []


def _to_running(state: JobState, msg: str) -> list[Step]:
    steps = _to_preparing(state, Reason.BackendPending, "the backend has the job")
    if state is not S.RUNNING:
        steps.append(Step(S.RUNNING, Reason.Running, msg))
    return steps


def derive(state: JobState, fact: Fact) -> Derived:
    """What `fact` implies for a job in `state` whose current attempt the fact describes."""
    ended = fact.phase in ENDED_PHASES
    if state not in HOLDING:
        return Derived(ended=ended)  # the job moved on (cancelled, requeued): nothing to say
    where = f" on {', '.join(fact.nodes)}" if fact.nodes else ""
    if fact.phase is Phase.PENDING:
        reason = fact.reason if fact.reason is not Reason.Unknown else Reason.BackendPending
        msg = fact.message or f"pending in the backend ({fact.raw_reason or 'no reason given'})"
        if state is S.RUNNING:
            return Derived()  # a stale observation; never step back
        return Derived((Step(S.PREPARING, reason, msg),))
    if fact.phase is Phase.STARTING:
        reason = fact.reason if fact.reason is not Reason.Unknown else Reason.WaitingForAllRanks
        if state is S.RUNNING:
            return Derived()
        return Derived((Step(S.PREPARING, reason, fact.message or "ranks are starting"),))
    if fact.phase is Phase.RUNNING:
        msg = f"all ranks run{where}"
        if state is S.RUNNING:  # a reason only (Running again after BackendUnavailable...)
            return Derived((Step(S.RUNNING, Reason.Running, msg),), started=True)
        return Derived(tuple(_to_running(state, msg)), started=True)
    if fact.phase is Phase.SUCCEEDED:
        steps = _to_running(state, f"all ranks ran{where}")
        steps.append(Step(S.SUCCEEDED, Reason.Succeeded, fact.message or "every rank exited 0"))
        return Derived(tuple(steps), ended=True, started=True)
    if fact.phase is Phase.PREEMPTED:
        steps = _to_preparing(state, Reason.BackendPending, "the backend had the job")
        steps.append(Step(S.RETRYING, Reason.Preempted, fact.message or "preempted"))
        started = fact.started_at is not None
        return Derived(tuple(steps), ended=True, preempted=True, started=started)
    if fact.phase is Phase.CANCELLED:
        who = f" by {fact.actor}" if fact.actor else " outside Isthmus"
        return Derived(
            (Step(S.CANCELLED, Reason.CancelledByAdmin, f"cancelled{who}"),), ended=True
        )
    if fact.phase in (Phase.FAILED, Phase.LOST):
        category = fact.failure or (
            FailureCategory.ORCHESTRATION if fact.phase is Phase.LOST else FailureCategory.UNKNOWN
        )
        msg = fact.message or (
            f"exit code {fact.exit_code}" if fact.exit_code is not None else fact.raw_state
        )
        steps = _to_preparing(state, Reason.BackendPending, "the backend had the job")
        steps.append(Step(S.FAILED, FAILURE_REASON[category], f"{category.value}: {msg}"))
        return Derived(tuple(steps), ended=True, failure=category,
                       started=fact.started_at is not None)
    return Derived()  # UNKNOWN: missing evidence changes nothing
