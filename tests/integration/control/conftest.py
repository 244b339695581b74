"""A control plane over two simulated backends (one of each kind), on both databases."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from backends.sim.backend import SimBackend
from broker.config import IsthmusConfig, parse_config
from broker.store import Database
from tests.harness.notice_sinks import Mailbox, Receiver, smtp_mailbox, webhook_receiver
from tests.harness.sim import CONFIG, Sim, make_sim


@pytest.fixture
def sim_config() -> IsthmusConfig:
    return parse_config(CONFIG)


@pytest.fixture
def sim(db: Database, sim_config: IsthmusConfig) -> Iterator[Sim]:
    yield make_sim(db, sim_config)


class Locked:
    """Serialises every call into a simulated backend (it is not thread-safe), so that the
    runtime's scheduler thread and the test thread moving virtual time never interleave."""

    def __init__(self, inner: SimBackend, lock: threading.Lock) -> None:
        self._inner, self._lock = inner, lock
        self.name, self.kind = inner.name, inner.kind

    def __getattr__(self, attr: str) -> object:
        target = getattr(self._inner, attr)
        if not callable(target):
            return target

        def call(*args: object, **kwargs: object) -> object:
            with self._lock:
                return target(*args, **kwargs)

        return call


@pytest.fixture
def threaded_sim(sim: Sim) -> Sim:
    lock = threading.Lock()
    sim.plane.backends = {n: Locked(b, lock) for n, b in sim.backends.items()}  # type: ignore[misc]
    original = sim.advance

    def advance(seconds: float) -> None:
        with lock:
            original(seconds)

    sim.advance = advance  # type: ignore[method-assign]
    return sim


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local webhook receiver (tests.harness.notice_sinks)."""
    with webhook_receiver() as got:
        yield got


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    """A local SMTP server and its port (tests.harness.notice_sinks)."""
    with smtp_mailbox() as box:
        yield box
