"""Transition rules: small classes with before / after / cleanup hooks.

A rule refuses a proposal by returning a Ruling (REJECT, WAIT or ABORT with a reason); it
never raises for an expected refusal. `before` may take side effects (reserve quota) that
`cleanup` undoes when a later rule refuses; `after` runs once the new state is written, in
the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlmodel import Session

from broker.domain import JobState, Reason, is_allowed
from broker.store.records import JobRecord


class Outcome(StrEnum):
    ACCEPT = "ACCEPT"  # the new state was written
    REJECT = "REJECT"  # the proposal is refused; the job keeps its state
    WAIT = "WAIT"  # not now; propose again after retry_after seconds
    ABORT = "ABORT"  # the proposal makes no sense for this job; do not propose again
    NOOP = "NOOP"  # already applied (same cause or same state and reason)


@dataclass(frozen=True, slots=True)
class Cause:
    """Who or what proposes a transition. `key` makes the proposal idempotent per job."""

    kind: str
    actor: str
    key: str | None = None
    facts_ref: str | None = None
    details: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Ruling:
    outcome: Outcome
    reason: Reason
    message: str
    retry_after: float | None = None


@dataclass(slots=True)
class TransitionContext:
    session: Session
    job: JobRecord
    src: JobState
    dst: JobState
    reason: Reason
    message: str
    cause: Cause
    now: datetime
    scratch: dict[str, Any] = field(default_factory=dict)  # rules pass data to their hooks


class Rule:
    """Base rule: declare the states it handles; override the hooks it needs."""

    from_states: frozenset[JobState] | None = None  # None: any
    to_states: frozenset[JobState] | None = None

    def applies(self, src: JobState, dst: JobState) -> bool:
        return (self.from_states is None or src in self.from_states) and (
            self.to_states is None or dst in self.to_states
        )

    def before(self, ctx: TransitionContext) -> Ruling | None:
        return None

    def after(self, ctx: TransitionContext) -> None:
        return None

    def cleanup(self, ctx: TransitionContext) -> None:
        return None


class AllowedTransitionsRule(Rule):
    def before(self, ctx: TransitionContext) -> Ruling | None:
        if is_allowed(ctx.src, ctx.dst):
            return None
        return Ruling(
            Outcome.REJECT,
            Reason.TransitionNotAllowed,
            f"{ctx.src} -> {ctx.dst} is not an allowed transition",
        )


class RetryEngineOnlyRule(Rule):
    """A move only the retry engine may make: FAILED is final unless it decides to retry,
    and a job waiting for its retry fails only when it says the job may not go on (too many
    preemptions, no retry budget left)."""

    def __init__(self, src: JobState, dst: JobState, message: str) -> None:
        self.from_states = frozenset({src})
        self.to_states = frozenset({dst})
        self.message = message

    def before(self, ctx: TransitionContext) -> Ruling | None:
        if ctx.cause.kind == "retry":
            return None
        return Ruling(Outcome.REJECT, Reason.RetryNotDecided, self.message)


class RuleSet:
    """An ordered list of rules; the transition table always comes first."""

    def __init__(self, rules: list[Rule] | None = None) -> None:
        self._rules: list[Rule] = [AllowedTransitionsRule(), *(rules or [])]

    def for_transition(self, src: JobState, dst: JobState) -> list[Rule]:
        return [r for r in self._rules if r.applies(src, dst)]
