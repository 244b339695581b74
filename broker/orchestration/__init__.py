"""The single entry point that changes job state, its rules, replay and the write paths."""

from broker.orchestration.rules import Cause, Outcome, Rule, RuleSet, Ruling, TransitionContext
from broker.orchestration.transitions import JobNotFound, TransitionResult, set_state

__all__ = [
    "Cause",
    "JobNotFound",
    "Outcome",
    "Rule",
    "RuleSet",
    "Ruling",
    "TransitionContext",
    "TransitionResult",
    "set_state",
]
