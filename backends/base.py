"""The backend protocol every adapter implements (Slurm, Kubernetes, simulator).

The core talks to backends only through this module. Adapters import their SDKs lazily, declare
what they can do, and refuse unsupported requests up front with a reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Flag, auto
from typing import Protocol, runtime_checkable

from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot


class Capability(Flag):
    NONE = 0
    GANG = auto()  # all-or-nothing start of several ranks
    TOPOLOGY = auto()  # can keep a gang inside a rack/block
    PREEMPT_SIGNAL = auto()  # signals the job before killing it (checkpoint grace)
    QUEUE_DEPTH = auto()  # reports pending demand, including foreign work
    ACCOUNTING = auto()  # knows about jobs after they left the queue


class BackendUnavailable(Exception):
    """The backend could not be reached. Never a job failure: callers keep facts unchanged."""


class Unsupported(Exception):
    """The request asks for something this backend cannot do; the message says what."""


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    job_id: str
    attempt: int
    name: str  # isthmus-<job>-<attempt>
    snapshot: RunSnapshot
    placement: Placement
    env: dict[str, str] = field(default_factory=dict)  # extra env (progress token, resume dir)


@dataclass(frozen=True, slots=True)
class SubmitResult:
    name: str
    backend_id: str
    adopted: bool  # True when the object already existed (a retried submit after a crash)


@dataclass(frozen=True, slots=True)
class CancelResult:
    name: str
    found: bool
    signalled: bool  # a grace signal was sent before the kill
    message: str = ""


@runtime_checkable
class Backend(Protocol):
    name: str
    kind: str
    capabilities: Capability

    def inventory(self) -> InventorySnapshot: ...

    def submit(self, request: SubmitRequest) -> SubmitResult: ...

    def lookup(self, name: str) -> Fact | None: ...

    def cancel(self, name: str, grace_seconds: int) -> CancelResult: ...

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        """Facts for every Isthmus-owned object, in one backend call (plus accounting for
        objects that left the queue). `names` lists objects the caller expects to exist."""
        ...


BackendFactory = Callable[..., Backend]
_REGISTRY: dict[str, BackendFactory] = {}


def register(kind: str, factory: BackendFactory) -> None:
    _REGISTRY[kind] = factory


def factory_for(kind: str) -> BackendFactory:
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise Unsupported(f"no backend adapter of kind '{kind}' is registered ({known})") from None
