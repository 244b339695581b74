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
        self.name, self.kind, self.capabilities = inner.name, inner.kind, inner.capabilities
        self._open = threading.Event()
        self._open.set()
        self.observe_too = True

    def block(self, observe: bool = True) -> None:
        """From now on inventory (and observe, unless told otherwise) hang."""
        self.observe_too = observe
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _hold(self) -> None:
        if not self._open.wait(self.limit):
            raise BackendUnavailable(f"{self.name} still blocked after {self.limit:g}s")

    def inventory(self) -> InventorySnapshot:
        self._hold()
        return self.inner.inventory()

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        if self.observe_too:
            self._hold()
        return self.inner.observe(names)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)
