"""Vocabulary shared by every layer: states, reasons, specs, attempts, failure categories."""

from broker.domain.attempts import Attempt, Placement, RunSnapshot, backend_object_name
from broker.domain.failures import FailureCategory
from broker.domain.reasons import REASONS, Reason, ReasonKind, most_severe, severity
from broker.domain.spec import BackendKind, JobSpec, TopologyLevel
from broker.domain.states import TERMINAL, TRANSITIONS, JobState, is_allowed, is_terminal

__all__ = [
    "REASONS",
    "TERMINAL",
    "TRANSITIONS",
    "Attempt",
    "BackendKind",
    "FailureCategory",
    "JobSpec",
    "JobState",
    "Placement",
    "Reason",
    "ReasonKind",
    "RunSnapshot",
    "TopologyLevel",
    "backend_object_name",
    "is_allowed",
    "is_terminal",
    "most_severe",
    "severity",
]
