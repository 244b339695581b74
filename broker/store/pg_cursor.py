"""The PostgreSQL cursor whose `description` is built when it is read, not when it is asked for.

psycopg builds `cursor.description` anew on every access: one `Column` object per column of
the result, each decoding the column's name and looking up its type. SQLAlchemy asks for it
after every statement that returns rows, and for a statement it has compiled before (all of
ours: its result metadata is cached) only checks that it is not None. For a 23-column job row
that was about a third of the client's CPU for the statement (issue 27). Here `description`
is a sequence of the result's columns whose `Column` objects are made on first read, from the
result they describe (a later execute on the cursor does not change them), so a reader that
indexes, slices or iterates it sees exactly what psycopg would have given.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import psycopg
from psycopg import pq
from psycopg._column import Column

_ROWS = frozenset(status for status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE,
                                        getattr(pq.ExecStatus, "TUPLES_CHUNK", None))
                  if status is not None)  # TUPLES_CHUNK: psycopg 3.2 and later


class _Result:
    """What a `Column` reads off its cursor, held for one result."""

    __slots__ = ("_encoding", "adapters", "pgresult")

    def __init__(self, cursor: psycopg.Cursor[Any], res: pq.abc.PGresult) -> None:
        self.pgresult = res
        self._encoding = cursor._encoding
        self.adapters = cursor.adapters


class Description(Sequence[Column]):
    """`cursor.description` of one result: its length known, its columns made when read."""

    __slots__ = ("_columns", "_n", "_source")

    def __init__(self, source: _Result, n: int) -> None:
        self._source = source
        self._n = n
        self._columns: list[Column] | None = None

    def _all(self) -> list[Column]:
        if self._columns is None:
            src: Any = self._source  # duck-typed as the cursor Column reads
            self._columns = [Column(src, i) for i in range(self._n)]
        return self._columns

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Column: ...

    @overload
    def __getitem__(self, i: slice) -> list[Column]: ...

    def __getitem__(self, i: int | slice) -> Column | list[Column]:
        return self._all()[i]

    def __iter__(self) -> Iterator[Column]:
        return iter(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


class LazyDescriptionCursor(psycopg.Cursor[Any]):
    """psycopg's default cursor but for `description` (see the module)."""

    @property
    def description(self) -> Description | None:  # type: ignore[override]
        res = self.pgresult
        # as psycopg decides: columns when the result has fields, or when it says it returned
        # rows (SELECT ; has none)
        if res and (res.nfields or res.status in _ROWS):
            return Description(_Result(self, res), res.nfields)
        return None
