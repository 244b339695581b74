"""broker.store.batch: one statement queued with different sets of parameter names (a ledger
release beside a charge) is sent as one executemany per set, so the flush succeeds and writes
every row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from broker.store import Database, batch

_META = sa.MetaData()
PROBE = sa.Table("batch_probe", _META, sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("a", sa.String), sa.Column("b", sa.String, nullable=True))
INSERT = sa.insert(PROBE)


@pytest.fixture
def probe(db: Database) -> Iterator[Database]:
    _META.create_all(db.writer)
    yield db
    _META.drop_all(db.writer)


def test_one_statement_with_other_columns_is_sent_per_set_of_names(probe: Database) -> None:
    sent: list[int] = []

    def count(conn: object, cursor: object, statement: str, params: object, *args: object
              ) -> None:
        if "batch_probe" in statement:
            sent.append(len(params) if isinstance(params, list) else 1)

    sa.event.listen(probe.writer, "before_cursor_execute", count)
    try:
        with probe.write() as s, batch.deferred(s):
            batch.write(s, INSERT, {"id": 1, "a": "x"})
            batch.write(s, INSERT, {"id": 2, "a": "y", "b": "charge"})
            batch.write(s, INSERT, {"id": 3, "a": "z"})
            batch.write(s, INSERT, {"id": 4, "a": "w", "b": "charge"})
    finally:
        sa.event.remove(probe.writer, "before_cursor_execute", count)
    with probe.read() as s:
        rows = s.connection().execute(sa.select(PROBE).order_by(PROBE.c.id)).all()
    assert [tuple(r) for r in rows] == [(1, "x", None), (2, "y", "charge"), (3, "z", None),
                                        (4, "w", "charge")]
    assert len(sent) == 2, sent  # one executemany per set of names, not one per row
