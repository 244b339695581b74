"""How a long-running Isthmus process (the server, `isthmus control`) sets Python's cyclic
garbage collector once it has started.

Nearly everything the loop and the API allocate is freed by reference counting the moment it
is dropped; the cyclic collector only finds cycles. CPython runs it every 700 container
allocations by default, and each run walks every young object; a cycle of the loop allocates
hundreds of thousands, so it ran hundreds of times a cycle, for almost nothing found
(bench/loop_cost.py measures it). And what start-up made (modules, configuration, compiled
statements, validators) lives as long as the process, yet every full collection walks it
again.

`settle()`, called once start-up is done, moves what start-up made out of the collector's
sight (`gc.freeze`: never scanned again, never freed) and runs young collections every
YOUNG_EVERY allocations instead. Cyclic garbage then waits at most that many allocations
to be found: a few megabytes at most, against a process of a hundred or more.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_EVERY = 20_000
"""Container allocations (less deallocations) between two young collections (CPython: 700).
The older generations keep CPython's own ratios."""


def settle() -> None:
    """Freeze what exists now and space the young collections out (see the module)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_EVERY, middle, old)


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """`settle()` for a block, the collector as it was after: for a benchmark that measures
    the loop as the runtime runs it, inside a process (a test's) that goes on after."""
    before = gc.get_threshold()
    settle()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
