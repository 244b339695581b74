"""Failure categories: every failure is classified before any retry is considered."""

from __future__ import annotations

from enum import StrEnum


class FailureCategory(StrEnum):
    USER_ERROR = "USER_ERROR"
    """Bad config, an exception in user code, a reproducible OOM, a timeout of max_runtime."""
    INFRA_TRANSIENT = "INFRA_TRANSIENT"
    """Node lost, network or storage timeout, preemption by the backend."""
    RESOURCE_ENV = "RESOURCE_ENV"
    """Driver, image or disk problems: the environment, not the code."""
    ORCHESTRATION = "ORCHESTRATION"
    """Lost, duplicated or out-of-sync backend objects."""
    UNKNOWN = "UNKNOWN"
    """Evidence was missing or unrecognised; never guessed into another category."""
