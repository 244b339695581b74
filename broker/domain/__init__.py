"""Vocabulary shared by every layer: states, reasons, specs, attempts, failure categories.

The names are loaded on first use (PEP 562): the command-line tools import light modules of
the domain (`broker.domain.states`, `broker.domain.units`) without paying for the pydantic
models of the specs (about 0.1 s of every `isthmus` call).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOME = {
    "Attempt": "broker.domain.attempts",
    "Placement": "broker.domain.attempts",
    "RunSnapshot": "broker.domain.attempts",
    "backend_object_name": "broker.domain.attempts",
    "FailureCategory": "broker.domain.failures",
    "REASONS": "broker.domain.reasons",
    "Reason": "broker.domain.reasons",
    "ReasonKind": "broker.domain.reasons",
    "most_severe": "broker.domain.reasons",
    "severity": "broker.domain.reasons",
    "BackendKind": "broker.domain.spec",
    "JobSpec": "broker.domain.spec",
    "HOLDING": "broker.domain.states",
    "TERMINAL": "broker.domain.states",
    "TRANSITIONS": "broker.domain.states",
    "JobState": "broker.domain.states",
    "is_allowed": "broker.domain.states",
    "is_terminal": "broker.domain.states",
    "starts_attempt": "broker.domain.states",
    "TopologyLevel": "broker.domain.topology",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


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
