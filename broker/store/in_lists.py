"""Look-ups by many keys, sent as IN lists of bounded length: one statement per IN_LIST_MAX
keys keeps each under SQLite's limit on a statement's parameters (two per key for the
(job, attempt) pairs) and PostgreSQL's plans small."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

T = TypeVar("T")
IN_LIST_MAX = 500


def in_chunks(keys: Sequence[T], size: int = IN_LIST_MAX) -> Iterator[Sequence[T]]:
    """`keys` in consecutive slices of at most `size`."""
    for start in range(0, len(keys), size):
        yield keys[start:start + size]


def pairs_in(first: Any, second: Any, name: str) -> Any:
    """`(first, second) IN :name` for a statement built once (`pair_params` gives its
    parameters), with `first IN` the pairs' first values beside it: SQLite answers a row-value
    IN list by reading the whole table (its cost grew with the table's history), and searches
    an index that starts with `first` for a plain IN list."""
    return sa.and_(first.in_(sa.bindparam(f"{name}_first", expanding=True)),
                   sa.tuple_(first, second).in_(sa.bindparam(name, expanding=True)))


def pair_params(name: str, pairs: Sequence[tuple[Any, Any]]) -> dict[str, list[Any]]:
    """The parameters of `pairs_in(..., name)` for `pairs`."""
    return {name: list(pairs), f"{name}_first": sorted({p[0] for p in pairs})}
