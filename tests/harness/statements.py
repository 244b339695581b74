"""The statements a block of a test sends to the database, as SQLAlchemy hands them to the
driver: what the tests of batched and narrowed reads and writes count."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa


@contextlib.contextmanager
def statements_sent(target: Any = sa.engine.Engine) -> Iterator[list[tuple[str, int]]]:
    """The statements sent through `target` (every engine by default) inside the block, in
    order: each one's text on one line, with its number of parameter sets (1 unless it was
    an executemany)."""
    sent: list[tuple[str, int]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
             many: bool) -> None:
        sent.append((" ".join(statement.split()), len(params) if many else 1))

    sa.event.listen(target, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        sa.event.remove(target, "before_cursor_execute", seen)
