"""What admission sees of each backend: every backend is asked for its inventory at once (one
call in flight per backend, see gate.py) and the cycle waits at most `wait` seconds for all of
them. Per backend the answer is then

- fresh: it answered within the wait;
- stale: it did not, and its last good inventory is at most `max_age` seconds old; that one is
  served, marked with the time it was taken;
- unavailable: its last call failed (the error and since when), or it has not answered and
  there is nothing recent enough to serve.

A call that answers after the cycle stopped waiting still refreshes the cache for the next one.
The cache is soft state: after a restart the first cycle simply waits for fresh answers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from datetime import datetime

from backends.base import BackendUnavailable
from broker.control.gate import Flight, GatedBackend
from broker.domain.inventory import InventorySnapshot
from broker.logs import get_logger

log = get_logger(__name__)


def stamp(at: datetime) -> str:
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Answer:
    snapshot: InventorySnapshot | None
    """None: the backend is unavailable."""
    note: str = ""
    """Why it is unavailable, or where a stale snapshot comes from; empty when fresh."""
    taken_at: datetime | None = None
    """When the call behind `snapshot` started (by the control plane's clock)."""

    @property
    def stale(self) -> bool:
        return self.snapshot is not None and bool(self.note)


@dataclass
class _View:
    snapshot: InventorySnapshot | None = None
    taken_at: datetime | None = None  # the plane's clock when that call started
    taken_mono: float = 0.0
    error: str | None = None  # of the last finished call, None when it succeeded
    failing_since: datetime | None = None
    started: dict[Flight, datetime] = field(default_factory=dict)  # calls not absorbed yet
    last: Flight | None = None  # the call absorbed last (calls of one backend run in turn)


def describe(exc: BaseException) -> str:
    if isinstance(exc, BackendUnavailable):
        return str(exc) or "unreachable"
    return f"{type(exc).__name__}: {exc}"  # an adapter bug: never stops the other backends


class Inventories:
    def __init__(self, clock: Callable[[], datetime], wait: float, max_age: float) -> None:
        self.clock, self.wait, self.max_age = clock, wait, max_age
        self._views: dict[str, _View] = {}
        self._lock = threading.Lock()

    def gather(self, gates: Mapping[str, GatedBackend]) -> dict[str, Answer]:
        now = self.clock()
        flights: dict[str, Flight] = {}
        for name, gate in gates.items():
            flight = gate.start_inventory()
            with self._lock:
                view = self._views.setdefault(name, _View())
                new = flight is not view.last and flight not in view.started
                if new:
                    view.started[flight] = now
            if new:  # a late answer refreshes the cache for the next cycle
                flight.future.add_done_callback(functools.partial(self._late, name, flight))
            flights[name] = flight
        futures.wait([f.future for f in flights.values()], timeout=self.wait)
        out: dict[str, Answer] = {}
        for name, flight in flights.items():
            if flight.future.done():
                self._absorb(name, flight)
            out[name] = self._answer(name, flight)
        return out

    def _late(self, name: str, flight: Flight, _future: object) -> None:
        self._absorb(name, flight)

    def _absorb(self, name: str, flight: Flight) -> None:
        exc = flight.future.exception()
        with self._lock:
            view = self._views[name]
            started = view.started.pop(flight, None)
            if started is None:
                return  # absorbed already (the callback and the cycle may both get here)
            view.last = flight
            if exc is None:
                if view.error is not None:
                    log.info("backend %s answers again", name)
                view.snapshot, view.taken_at, view.taken_mono = (
                    flight.future.result(), started, flight.started
                )
                view.error = view.failing_since = None
                return
            error = describe(exc)
            if error != view.error:
                log.warning("backend %s unreachable for inventory: %s", name, error)
            view.error = error
            view.failing_since = view.failing_since or started

    def _answer(self, name: str, flight: Flight) -> Answer:
        with self._lock:
            view = self._views[name]
            if view.error is not None:  # the last finished call failed
                since = stamp(view.failing_since) if view.failing_since else "now"
                return Answer(None, f"backend {name} unreachable since {since}: {view.error}")
            if flight.future.done():
                return Answer(view.snapshot, "", view.taken_at)
            asked = view.started.get(flight)
            if (view.snapshot is not None and view.taken_at is not None
                    and time.monotonic() - view.taken_mono <= self.max_age):
                return Answer(
                    view.snapshot,
                    f"inventory of {name} as of {stamp(view.taken_at)}: no answer within "
                    f"{self.wait:g}s since",
                    view.taken_at,
                )
            since = stamp(asked) if asked else "its first call"
            older = "" if view.snapshot is None else \
                f"; its last inventory is older than {self.max_age:g}s"
            return Answer(None, f"backend {name} has not answered since {since}{older}")

    def peek(self) -> dict[str, Answer]:
        """What each backend last answered, without asking it (for the read-only views): its
        last good inventory and when it was taken, or the error of its last call."""
        out: dict[str, Answer] = {}
        with self._lock:
            for name, view in self._views.items():
                note = ""
                if view.error is not None:
                    since = stamp(view.failing_since) if view.failing_since else "now"
                    note = f"backend {name} unreachable since {since}: {view.error}"
                out[name] = Answer(view.snapshot, note, view.taken_at)
        return out
