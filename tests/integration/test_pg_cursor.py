"""The PostgreSQL engine's cursors build `description` when it is read (broker.store.pg_cursor):
what a reader sees is psycopg's own description, of the result it was asked for."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from broker.store.db import Database
from broker.store.pg_cursor import Description, LazyDescriptionCursor
from broker.store.tables import JOBS
from tests.fixtures.postgres import POSTGRES_ONLY

pytestmark = POSTGRES_ONLY


def _psycopg_description(cur: psycopg.Cursor[Any]) -> Any:
    return psycopg.Cursor.description.fget(cur)  # type: ignore[attr-defined]


def test_the_engine_cursors_describe_their_result_on_read(db: Database) -> None:
    with db.writer.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        assert isinstance(cur, LazyDescriptionCursor)
        cur.execute("SELECT 1 AS one, 'x'::varchar(7) AS two, now() AS three")
        desc = cur.description
        assert isinstance(desc, Description)
        assert desc._columns is None  # nothing built until read
        own = _psycopg_description(cur)
        assert len(desc) == 3
        assert [tuple(c) for c in desc] == [tuple(c) for c in own]
        assert [c.name for c in desc] == ["one", "two", "three"]
        assert desc[-1].type_code == own[-1].type_code == 1184
        assert [tuple(c) for c in desc[1:]] == [tuple(c) for c in own[1:]]
        assert desc[1].type_display == own[1].type_display == "varchar(7)"
        # read after the cursor moved on: still the first result's columns
        cur.execute("SELECT 2 AS other")
        later = cur.description
        assert later is not None and [c.name for c in later] == ["other"]
        fresh = cur.description
        assert fresh is not None and fresh._columns is None
        cur.execute("SELECT 1 AS a, 2 AS b")
        assert [c.name for c in fresh] == ["other"]
        # statements that return no rows have none; SELECT with no column has an empty one
        cur.execute("CREATE TEMP TABLE t (x int)")
        assert cur.description is None and _psycopg_description(cur) is None
        cur.execute("SELECT")
        empty = cur.description
        assert empty is not None and len(empty) == 0 and list(empty) == []
        conn.rollback()


def test_sqlalchemy_reads_rows_through_it(db: Database) -> None:
    """SQLAlchemy's results (cached metadata, textual, RETURNING) are unchanged."""
    with db.write() as s:
        conn = s.connection()
        rows = conn.execute(sa.select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id == "none"))
        assert rows.keys() == ["id", "state"] and rows.all() == []
        text = conn.execute(sa.text("SELECT 5 AS five, 'v' AS vee")).mappings().one()
        assert dict(text) == {"five": 5, "vee": "v"}
        many = conn.execute(sa.text("SELECT g AS n FROM generate_series(1, 3) AS g"))
        assert [r.n for r in many] == [1, 2, 3]
        s.rollback()


@pytest.mark.parametrize("n", [1, 3])
def test_insert_returning_many_rows(db: Database, n: int) -> None:
    """SQLAlchemy's insertmanyvalues slices `description` to sort the returned rows."""
    table = sa.Table("tmp_rt", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("v", sa.String))
    with db.write() as s:
        conn = s.connection()
        conn.exec_driver_sql("CREATE TEMP TABLE tmp_rt (id serial primary key, v text)")
        got = conn.execute(sa.insert(table).returning(table.c.id, table.c.v,
                                                       sort_by_parameter_order=True),
                           [{"v": f"v{i}"} for i in range(n)]).all()
        assert [r.v for r in got] == [f"v{i}" for i in range(n)]
        s.rollback()
