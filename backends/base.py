"""The backend protocol every adapter implements (Slurm, Kubernetes, simulator).

The core talks to backends only through this module. Adapters import their SDKs lazily, declare
what they can do, and refuse unsupported requests up front with a reason.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.facts import Fact, Phase
from broker.domain.inventory import InventorySnapshot
from broker.domain.reasons import Reason


class BackendUnavailable(Exception):
    """The backend could not be reached. Never a job failure: callers keep facts unchanged."""


class Unsupported(Exception):
    """The request asks for something this backend cannot do; the message says what."""


class SettingsError(ValueError):
    """Backend settings that do not fit the adapter's schema: one (key path, message) per
    problem, so that `isthmus config check` and the server can name each key."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{key}: {msg}" if key else msg for key, msg in problems))


S = TypeVar("S")


def parse_settings(cls: type[S], data: Mapping[str, Any] | None, kind: str) -> S:
    """Build a settings dataclass from isthmus.yaml (`backends[].settings`), checking every key
    and every value against the field types (the dataclass sets `__pydantic_config__` with
    `extra="forbid"`). Raises SettingsError naming each bad key."""
    from pydantic import TypeAdapter, ValidationError

    if data is not None and not isinstance(data, Mapping):
        raise SettingsError([("", "settings must be a mapping of setting: value")])
    try:
        return TypeAdapter(cls).validate_python(dict(data or {}))
    except ValidationError as exc:
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "unexpected_keyword_argument":
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; known: {known}"
                problems.append((key, f"unknown {kind} backend setting{hint}"))
            else:
                problems.append((key, err["msg"].removeprefix("Value error, ")))
        raise SettingsError(problems) from None


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    job_id: str
    attempt: int
    name: str  # isthmus-<job>-<attempt>
    snapshot: RunSnapshot
    placement: Placement
    env: dict[str, str] = field(default_factory=dict)  # extra env (progress token, resume dir)
    owner: str | None = None  # who submitted the job (the API caller's name)
    job_number: int | None = None  # the job's numeric id (SLURM_JOB_ID, %j); None: unnumbered

    @property
    def slurm_job_id(self) -> str:
        """The id a Slurm user sees for the job: its number (else the Isthmus id)."""
        return str(self.job_number) if self.job_number is not None else self.job_id


Rendering = str | list[dict[str, Any]] | None
"""A batch script, a list of manifests, or None for a backend that sends no such text (the
simulator)."""

MASK = "********"
SECRET_ENV = ("ISTHMUS_PROGRESS_TOKEN",)
"""Request env values that are nobody's business to read in a rendering kept for people."""


def masked(request: SubmitRequest) -> SubmitRequest:
    """`request` with the values of SECRET_ENV masked: what renderings for people are made of."""
    hidden = {k: MASK for k in SECRET_ENV if k in request.env}
    return replace(request, env={**request.env, **hidden}) if hidden else request


@dataclass(frozen=True, slots=True)
class SubmitResult:
    name: str
    backend_id: str
    adopted: bool  # True when the object already existed (a retried submit after a crash)
    rendered: Rendering = None
    """What submit rendered and sent, as `render` of the `masked` request shows it (the
    attempt's record, so that a dispatch renders once)."""


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

    def inventory(self) -> InventorySnapshot: ...

    def render(self, request: SubmitRequest) -> Rendering:
        """What `submit` would send for `request` (a batch script, manifests), for people
        (`isthmus render`, the attempt's record). No I/O beyond the adapter's caches."""
        ...

    def submit(self, request: SubmitRequest) -> SubmitResult:
        """Create the object named `request.name`; idempotent by name: an existing object of
        that name is adopted (`adopted`). The result carries what was rendered (`rendered`,
        secrets masked), so the caller need not render again."""
        ...

    def lookup(self, name: str) -> Fact | None: ...

    def cancel(self, name: str, grace_seconds: int) -> CancelResult: ...

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        """Facts for every Isthmus-owned object, in one backend call (plus accounting for
        objects that left the queue). `names` lists objects the caller expects to exist.
        A list, or an `Observed` whose facts are built when read."""
        ...


Said = tuple[str, str, str]
"""What the backend said of one object, enough to see a change: its phase and reason (their
values), and the message while the object waits or starts (the job shows that message: a
Kueue verdict after 'not evaluated yet', Slurm's Priority then Resources), else ""."""

_WAITING = frozenset({Phase.PENDING, Phase.STARTING})


def said_of(phase: Phase, reason: Reason, message: str) -> Said:
    return (phase.value, reason.value, message if phase in _WAITING else "")


class Observed(Sequence[Fact]):
    """An answer of `observe` whose Facts are built only when read. `said` holds each object's
    `Said` (said_of), one entry per fact in their order, taken when the backend
    was observed; `build(name)` makes that object's Fact as it was then. A caller that needs
    only to see whether anything changed (the reconciler, over every live attempt on every
    pass) reads `said` and builds the few facts that differ; every other caller reads a
    Sequence of Facts as from any adapter. `newest` is the newest observation in it."""

    __slots__ = ("_build", "_built", "_order", "newest", "said")

    def __init__(self, said: dict[str, Said], build: Callable[[str], Fact],
                 newest: datetime | None) -> None:
        self.said = said
        self.newest = newest
        self._build = build
        self._built: dict[str, Fact] = {}
        self._order: list[str] | None = None

    def fact(self, name: str) -> Fact | None:
        """The Fact of object `name` (None when the answer has none)."""
        if name not in self.said:
            return None
        built = self._built.get(name)
        if built is None:
            built = self._built[name] = self._build(name)
        return built

    def __len__(self) -> int:
        return len(self.said)

    @overload
    def __getitem__(self, index: int) -> Fact: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Fact]: ...

    def __getitem__(self, index: int | slice) -> Fact | Sequence[Fact]:
        if self._order is None:
            self._order = list(self.said)
        if isinstance(index, slice):
            return [self._fact(n) for n in self._order[index]]
        return self._fact(self._order[index])

    def __iter__(self) -> Iterator[Fact]:
        return (self._fact(n) for n in list(self.said))

    def _fact(self, name: str) -> Fact:
        fact = self.fact(name)
        assert fact is not None
        return fact

    def __eq__(self, other: object) -> bool:  # as a list of its facts
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Observed({list(self)!r})"


@dataclass(frozen=True, slots=True)
class RankLog:
    """The output of one rank of a backend object (or of all ranks, `rank` None, where the
    backend keeps them in one stream), as far as the backend can serve it."""

    rank: int | None
    text: str
    source: str
    """Where it was read: a file path, a pod name, the simulator."""
    note: str = ""
    """Why it is empty or partial (a node that serves no logs, a file not readable here)."""


@runtime_checkable
class LogReader(Protocol):
    """Optional: a backend that can serve the output of its objects' ranks
    (`isthmus logs`). `tail` keeps the last lines of each rank; None keeps all."""

    def logs(self, name: str, rank: int | None = None,
             tail: int | None = None) -> list[RankLog]: ...


def tail_lines(text: str, tail: int | None) -> str:
    if tail is None:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[-tail:]) if tail > 0 else ""
