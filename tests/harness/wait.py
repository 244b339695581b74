"""The one way tests wait: poll a condition until it holds, with a generous deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None],
    timeout: float = 60.0,
    what: str = "",
    *,
    interval: float = 0.25,
    between: Callable[[], object] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy and return that value; fail the test
    after ``timeout`` seconds, naming ``what`` and the last value seen. ``between`` runs after
    each miss (e.g. to move a simulated clock on)."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what or probe}; last: {last!r}"
            )
        if between is not None:
            between()
        time.sleep(interval)
