"""One writer per backend adapter, and backend calls that cannot stall the control loop.

The Slurm and Kubernetes adapters keep their caches in plain dicts and are not thread-safe,
while admission, dispatch and the reconcilers run as separate scheduler jobs that may overlap.
A GatedBackend wraps one adapter and lets exactly one call into it run at a time (one lock per
adapter; different adapters never wait for each other):

- submit, lookup and cancel run in the caller's thread once they hold the lock. They wait for
  it at most `lock_wait` seconds, and not at all when the call holding it has already run that
  long (so a hung backend costs each later caller nothing, not `lock_wait` each). A caller that
  gets no lock sees BackendUnavailable, which the dispatcher and the reconcilers keep as a
  reason and retry on their next pass.
- inventory and observe run in a worker thread, at most one of each in flight per adapter.
  The caller waits with a timeout and leaves the call running when it expires: the lock stays
  with the call in flight, the caller goes on. `start_inventory` hands out the in-flight call so
  that the control plane can wait for all backends at once and use a late answer when it
  comes. Worker threads are daemons: a hung backend never holds up the process's exit.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from backends.base import (
    Backend,
    BackendUnavailable,
    CancelResult,
    Rendering,
    SubmitRequest,
    SubmitResult,
)
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot

T = TypeVar("T")
WORKER_IDLE_S = 30.0
"""A worker thread with no call for this long ends; the next call starts another."""


@dataclass(eq=False)
class Flight:
    """One call running in a worker thread."""

    op: str
    future: Future[Any]
    started: float = field(default_factory=time.monotonic)
    """time.monotonic() when the call was started."""

    def age(self) -> float:
        return time.monotonic() - self.started


class GatedBackend:
    """A Backend that serialises every call into `inner` (see the module docstring)."""

    def __init__(self, inner: Backend, *, lock_wait: float = 10.0,
                 observe_timeout: float = 60.0) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.kind: str = inner.kind
        self.lock_wait = lock_wait
        self.observe_timeout = observe_timeout
        self._lock = threading.Lock()
        self._holder: tuple[str, float] | None = None  # (call, monotonic start) holding _lock
        self._flights: dict[str, Flight] = {}
        self._workers: dict[str, queue.SimpleQueue[tuple[contextvars.Context,
                                                         Callable[[], None]]]] = {}
        self._flights_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GatedBackend({self.inner!r})"

    def on_change(self, callback: Callable[[], None]) -> bool:
        """Hand `callback` to the adapter's change feed (a Kubernetes backend's watches call it
        on every Job, pod or Workload event), outside this gate's lock: it only wakes a
        control job. False when the adapter has no feed (Slurm, the simulator)."""
        hook = getattr(self.inner, "on_change", None)
        if not callable(hook):
            return False
        hook(callback)
        return True

    # ---- the lock ----------------------------------------------------------------------
    @contextmanager
    def _held(self, op: str, wait: float | None) -> Iterator[None]:
        """Hold the adapter's lock for one call; `wait` None waits as long as it takes."""
        if wait is None:
            self._lock.acquire()
        else:
            holder = self._holder
            if holder is not None and time.monotonic() - holder[1] >= wait:
                wait = 0.0  # the holder is stuck already: do not queue up behind it
            got = self._lock.acquire(timeout=wait) if wait > 0 else self._lock.acquire(False)
            if not got:
                raise BackendUnavailable(f"{self.name} is busy: {self.busy_with()}")
        self._holder = (op, time.monotonic())
        try:
            yield
        finally:
            self._holder = None
            self._lock.release()

    def busy_with(self) -> str:
        holder = self._holder
        if holder is None:
            return "another call holds it"
        return f"its {holder[0]} call has run for {time.monotonic() - holder[1]:.0f}s"

    # ---- calls in a worker thread ------------------------------------------------------
    def _start(self, op: str, fn: Callable[[], T]) -> Flight:
        with self._flights_lock:
            flight = self._flights.get(op)
            if flight is not None and not flight.future.done():
                return flight
            flight = self._flights[op] = Flight(op, Future())

        def run() -> None:
            future = flight.future
            if not future.set_running_or_notify_cancel():
                return
            try:
                with self._held(op, None):
                    result = fn()
            except BaseException as exc:  # handed to whoever waits; nothing escapes a worker
                future.set_exception(exc)
            else:
                future.set_result(result)

        # in a copy of the caller's context: its lines carry the cycle that asked (broker.logs)
        self._submit(op, (contextvars.copy_context(), run))
        return flight

    def _submit(self, op: str, item: tuple[contextvars.Context, Callable[[], None]]) -> None:
        """Hand `item` to the worker thread of `op`, started if there is none (a thread per
        call cost more than a quiet reconcile pass's own work). One is enough: at most one
        call of an op is in flight, and a call that hangs keeps its worker as it kept its own
        thread before. A worker idle for WORKER_IDLE_S ends (tests make thousands of gates)."""
        with self._flights_lock:  # puts and a worker's leaving are ordered by this lock
            work = self._workers.get(op)
            if work is None:
                work = self._workers[op] = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(op, work),
                                 name=f"isthmus-{self.name}-{op}", daemon=True).start()
            work.put(item)

    def _serve(self, op: str,
               work: queue.SimpleQueue[tuple[contextvars.Context, Callable[[], None]]]) -> None:
        while True:
            try:
                ctx, run = work.get(timeout=WORKER_IDLE_S)
            except queue.Empty:
                with self._flights_lock:
                    if work.empty():
                        del self._workers[op]
                        return
                continue
            ctx.run(run)

    def in_flight(self, op: str) -> Flight | None:
        with self._flights_lock:
            flight = self._flights.get(op)
        return flight if flight is not None and not flight.future.done() else None

    def start_inventory(self) -> Flight:
        """The inventory call in flight, or a new one (its future yields the snapshot)."""
        return self._start("inventory", self.inner.inventory)

    # ---- the Backend protocol ----------------------------------------------------------
    def inventory(self) -> InventorySnapshot:
        """Blocking (tools and tests); the control plane waits with a budget instead."""
        snapshot: InventorySnapshot = self.start_inventory().future.result()
        return snapshot

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        previous = self.in_flight("observe")
        if previous is not None:
            raise BackendUnavailable(
                f"{self.name} has not answered the previous observe call for "
                f"{previous.age():.0f}s"
            )
        wanted = None if names is None else list(names)
        flight = self._start("observe", lambda: self.inner.observe(wanted))
        try:
            facts: Sequence[Fact] = flight.future.result(timeout=self.observe_timeout)
        except TimeoutError:
            raise BackendUnavailable(
                f"{self.name} did not answer observe within {self.observe_timeout:g}s"
            ) from None
        return facts

    def submit(self, request: SubmitRequest) -> SubmitResult:
        with self._held("submit", self.lock_wait):
            return self.inner.submit(request)

    def render(self, request: SubmitRequest) -> Rendering:
        # renderers read caches the inventory fills (GPU types, learned tolerations)
        with self._held("render", self.lock_wait):
            return self.inner.render(request)

    def lookup(self, name: str) -> Fact | None:
        with self._held("lookup", self.lock_wait):
            return self.inner.lookup(name)

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        with self._held("cancel", self.lock_wait):
            return self.inner.cancel(name, grace_seconds)

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet (a copy): never recurse
            raise AttributeError(attr)
        target = getattr(self.inner, attr)
        if attr not in ("logs", "send_signal"):
            return target  # adapter extras (close, start): not the control loop's calls

        def held(*args: Any, **kwargs: Any) -> Any:
            # logs and signals share the adapter's client (and state) with the loop
            with self._held(attr, self.lock_wait):
                return target(*args, **kwargs)

        return held


class UnavailableBackend:
    """Stands in for a configured backend whose adapter could not be built: every call says
    why, so its pools stay visible and its jobs wait with BackendUnavailable."""

    def __init__(self, name: str, kind: str, error: str) -> None:
        self.name, self.kind, self.error = name, kind, error

    def _refuse(self) -> BackendUnavailable:
        return BackendUnavailable(f"the {self.kind} adapter could not be built: {self.error}")

    def inventory(self) -> InventorySnapshot:
        raise self._refuse()

    def submit(self, request: SubmitRequest) -> SubmitResult:
        raise self._refuse()

    def render(self, request: SubmitRequest) -> Rendering:
        raise self._refuse()

    def lookup(self, name: str) -> Fact | None:
        raise self._refuse()

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        raise self._refuse()

    def observe(self, names: Sequence[str] | None = None) -> list[Fact]:
        raise self._refuse()
