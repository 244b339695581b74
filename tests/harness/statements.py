"""The statements a block of a test sends to the database, as SQLAlchemy hands them to the
driver, and the transactions it opens: what the tests of batched and narrowed reads and writes
count."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa


@contextlib.contextmanager
def statements_sent(target: Any = sa.engine.Engine) -> Iterator[list[tuple[str, int]]]:
    """The statements sent through `target` (every engine by default) inside the block, in
    order: each one's text on one line, with the number of rows it carried (`rows_of`)."""
    sent: list[tuple[str, int]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
             many: bool) -> None:
        sent.append((" ".join(statement.split()), rows_of(statement, params, many)))

    sa.event.listen(target, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        sa.event.remove(target, "before_cursor_execute", seen)


def rows_of(statement: str, params: Any, many: bool) -> int:
    """The rows a statement carried: its parameter sets (1 unless an executemany), or for an
    insert that takes its rows as one JSON array (broker.store.batch on PostgreSQL) that
    array's length."""
    if "jsonb_array_elements(CAST(%(rows)s AS JSONB))" in statement:
        sets = params if many else [params]
        return sum(len(json.loads(p["rows"])) for p in sets)
    return len(params) if many else 1


def transactions_opened(db: Any, kind: str, monkeypatch: Any) -> list[int]:
    """Count the `db.read()` or `db.write()` (`kind`) transactions opened from now on, for
    the rest of the test: one counter, in a list the caller reads (and may reset)."""
    opened = [0]
    original = getattr(db, kind)

    @contextlib.contextmanager
    def counted() -> Iterator[Any]:
        opened[0] += 1
        with original() as s:
            yield s

    monkeypatch.setattr(db, kind, counted)
    return opened
