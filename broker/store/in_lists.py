"""Look-ups by many keys. On SQLite an IN list of bounded length: one statement per
IN_LIST_MAX keys keeps each under its limit on a statement's parameters (two per key for the
(job, attempt) pairs). On PostgreSQL the keys travel as arrays, one parameter per column
(`= ANY (array)`, pairs through `unnest`): the statement's text is the same for any number of
keys, so the driver keeps its parsed form and the server its prepared plan, and no text is
rendered per call (an IN list of a few hundred keys cost the client 4x what the array does)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeDecorator

T = TypeVar("T")
IN_LIST_MAX = 500


def in_chunks(keys: Sequence[T], size: int = IN_LIST_MAX) -> Iterator[Sequence[T]]:
    """`keys` in consecutive slices of at most `size`."""
    for start in range(0, len(keys), size):
        yield keys[start:start + size]


class _Array(TypeDecorator[list[Any]]):
    """A list of values of `item` bound as one parameter: a PostgreSQL array of it (the
    element's own bind processing applies to each value)."""

    impl = sa.String
    cache_ok = True

    def __init__(self, item: Any) -> None:
        super().__init__()
        self.item = item

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            # strings without the column's length: a cast to VARCHAR(16)[] would cut a longer
            # key down to one that matches (SQLite, comparing as given, would find nothing)
            item = sa.String() if self.item._type_affinity is sa.String else self.item
            return dialect.type_descriptor(postgresql.ARRAY(item))
        # never bound off PostgreSQL: the other dialects compile an expanding IN list instead
        return dialect.type_descriptor(sa.String())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return list(value)


class _OneOf(ColumnElement[Any]):
    """`column IN :name` (or NOT IN): an expanding IN list, an array on PostgreSQL."""

    inherit_cache = True
    type = sa.types.NullType()
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement),
                           ("values", InternalTraversal.dp_clauseelement),
                           ("negate", InternalTraversal.dp_boolean)]

    def __init__(self, column: Any, name: str, negate: bool) -> None:
        self.column = column
        self.values = sa.bindparam(name, type_=_Array(column.type))
        self.negate = negate

    @property
    def _from_objects(self) -> list[Any]:
        return list(self.column._from_objects)


@compiles(_OneOf)
def _one_of_listed(element: _OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    listed = sa.bindparam(element.values.key, expanding=True, type_=element.column.type)
    test = element.column.not_in(listed) if element.negate else element.column.in_(listed)
    return str(compiler.process(test, **kw))


@compiles(_OneOf, "postgresql")
def _one_of_array(element: _OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    values = compiler.process(element.values, **kw)
    # NOT IN a set the server hashes once: `<> ALL (array)` compares each row with every
    # element (12,000 rows against 12,000 ids took 520 ms, this 10 ms)
    return (f"{column} NOT IN (SELECT unnest({values}))" if element.negate
            else f"{column} = ANY ({values})")


def one_of(column: Any, name: str) -> Any:
    """`column IN :name`, for a statement built once: the keys are bound as one list."""
    return _OneOf(column, name, False)


def none_of(column: Any, name: str) -> Any:
    """`column NOT IN :name` (an empty list excludes nothing), as `one_of`; on PostgreSQL
    against the array's elements as a set the server hashes."""
    return _OneOf(column, name, True)


class _PairsIn(ColumnElement[Any]):
    """`(first, second) IN :name`, with `first IN` the pairs' first values beside it."""

    inherit_cache = True
    type = sa.types.NullType()
    _traverse_internals = [("first", InternalTraversal.dp_clauseelement),
                           ("second", InternalTraversal.dp_clauseelement),
                           ("firsts", InternalTraversal.dp_clauseelement),
                           ("pair_firsts", InternalTraversal.dp_clauseelement),
                           ("pair_seconds", InternalTraversal.dp_clauseelement)]

    def __init__(self, first: Any, second: Any, name: str) -> None:
        self.first, self.second = first, second
        self.firsts = sa.bindparam(f"{name}_first", type_=_Array(first.type))
        self.pair_firsts = sa.bindparam(f"{name}_1", type_=_Array(first.type))
        self.pair_seconds = sa.bindparam(f"{name}_2", type_=_Array(second.type))

    @property
    def _from_objects(self) -> list[Any]:
        return list(self.first._from_objects)


@compiles(_PairsIn)
def _pairs_listed(element: _PairsIn, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite answers a row-value IN list by reading the whole table (its cost grew with the
    # table's history), and searches an index that starts with `first` for a plain IN list
    first, second, name = element.first, element.second, element.firsts.key[:-len("_first")]
    test = sa.and_(
        first.in_(sa.bindparam(element.firsts.key, expanding=True, type_=first.type)),
        sa.tuple_(first, second).in_(sa.bindparam(name, expanding=True)))
    return str(compiler.process(test, **kw))


@compiles(_PairsIn, "postgresql")
def _pairs_array(element: _PairsIn, compiler: SQLCompiler, **kw: Any) -> str:
    first, second = (compiler.process(c, **kw) for c in (element.first, element.second))
    firsts, ones, twos = (compiler.process(p, **kw) for p in
                          (element.firsts, element.pair_firsts, element.pair_seconds))
    # compiled fragments only: the values are bound parameters
    return (f"{first} = ANY ({firsts}) AND ({first}, {second}) IN "  # noqa: S608
            f"(SELECT * FROM unnest({ones}, {twos}))")


def pairs_in(first: Any, second: Any, name: str) -> Any:
    """`(first, second) IN :name` for a statement built once (`pair_params` gives its
    parameters), with `first IN` the pairs' first values beside it (an index that starts
    with `first` is searched for them)."""
    return _PairsIn(first, second, name)


def pair_params(name: str, pairs: Sequence[tuple[Any, Any]]) -> dict[str, list[Any]]:
    """The parameters of `pairs_in(..., name)` for `pairs`, for either database."""
    return {name: list(pairs), f"{name}_first": sorted({p[0] for p in pairs}),
            f"{name}_1": [p[0] for p in pairs], f"{name}_2": [p[1] for p in pairs]}
