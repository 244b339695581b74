"""The single entry point that changes job state, its rules, replay and the write paths."""

from broker.orchestration.rules import Cause, Decision, Outcome, Rule, RuleSet, TransitionContext
from broker.orchestration.transitions import JobNotFound, TransitionResult, set_state

__all__ = [
    "Cause",
    "Decision",
    "JobNotFound",
    "Outcome",
    "Rule",
    "RuleSet",
    "TransitionContext",
    "TransitionResult",
    "set_state",
]
