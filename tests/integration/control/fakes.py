"""Backends for control-loop tests that misbehave on purpose."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from backends.base import Backend, BackendUnavailable
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot


class BlockingBackend:
    """Wraps a backend; while blocked, inventory and observe hang (a hung `scontrol`, an API
    server that accepts connections and never answers) until released, at most `limit`
    seconds, so that a test that fails before releasing cannot hang the session."""

    def __init__(self, inner: Backend, limit: float = 30.0) -> None:
        self.inner, self.limit = inner, limit
        self.name, self.kind = inner.name, inner.kind
        self._open = threading.Event()
        self._open.set()
        self.observe_too = True
        self.hanging: list[str] = []
        """The calls hanging now, by name."""
        self.ended: list[str] = []
        """The calls that have ended since the last `block` (released, or given up at
        `limit`): a caller that went on while its call is not here did not wait for it."""
        self._count = threading.Lock()

    def block(self, observe: bool = True) -> None:
        """From now on inventory (and observe, unless told otherwise) hang."""
        self.observe_too = observe
        with self._count:
            self.ended.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _hold(self, call: str) -> None:
        with self._count:
            self.hanging.append(call)
        try:
            if not self._open.wait(self.limit):
                raise BackendUnavailable(f"{self.name} still blocked after {self.limit:g}s")
        finally:
            with self._count:
                self.hanging.remove(call)
                self.ended.append(call)

    def inventory(self) -> InventorySnapshot:
        self._hold("inventory")
        return self.inner.inventory()

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        if self.observe_too:
            self._hold("observe")
        return self.inner.observe(names)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)
