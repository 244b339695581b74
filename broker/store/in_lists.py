"""Look-ups by many keys, sent as IN lists of bounded length: one statement per IN_LIST_MAX
keys keeps each under SQLite's limit on a statement's parameters (two per key for the
(job, attempt) pairs) and PostgreSQL's plans small."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
IN_LIST_MAX = 500


def in_chunks(keys: Sequence[T], size: int = IN_LIST_MAX) -> Iterator[Sequence[T]]:
    """`keys` in consecutive slices of at most `size`."""
    for start in range(0, len(keys), size):
        yield keys[start:start + size]
