"""Vocabulary shared by every layer: states, reasons, specs, attempts, failure categories."""

from broker.domain.attempts import Attempt, Placement, RunSnapshot, backend_object_name
from broker.domain.failures import FailureCategory
from broker.domain.reasons import REASONS, Reason, ReasonKind, most_severe, severity
from broker.domain.spec import BackendKind, JobSpec
from broker.domain.states import (
    HOLDING,
    TERMINAL,
    TRANSITIONS,
    JobState,
    is_allowed,
    is_terminal,
    starts_attempt,
)
from broker.domain.topology import TopologyLevel

__all__ = [
    "HOLDING",
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
    "starts_attempt",
]
