"""broker.store.batch: one statement queued with different sets of parameter names (a ledger
release beside a charge) is sent as one executemany per set, so the flush succeeds and writes
every row."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg import pq

from broker.store import Database, batch, daily_sums, notices, quota_counters
from broker.store.tables import LEDGER_DAILY, NOTICES, UTCDateTime
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.statements import statements_sent

_META = sa.MetaData()
PROBE = sa.Table("batch_probe", _META, sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("a", sa.String), sa.Column("b", sa.String, nullable=True),
                 sa.Column("at", UTCDateTime, nullable=True))
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
    assert [tuple(r) for r in rows] == [(1, "x", None, None), (2, "y", "charge", None),
                                        (3, "z", None, None), (4, "w", "charge", None)]
    assert len(sent) == 2, sent  # one executemany per set of names, not one per row


def test_a_flush_sends_the_drivers_executemany_with_the_columns_conversions(
        probe: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """On both databases a batched statement goes to the driver as it is (SQLAlchemy's
    per-row bookkeeping left out), each value still converted by its column's type: a
    timestamp given in another zone is stored as the same instant in UTC."""
    taken: list[bool] = []
    real = batch._executemany_plain

    def spy(conn: object, stmt: object, many: list[dict[str, object]]) -> bool:
        taken.append(real(conn, stmt, many))
        return taken[-1]

    monkeypatch.setattr(batch, "_executemany_plain", spy)
    at = datetime(2026, 12, 6, 10, 0, tzinfo=timezone(timedelta(hours=2)))
    with probe.write() as s, batch.deferred(s):
        for i in range(3):
            batch.write(s, INSERT, {"id": i, "a": "x", "b": None, "at": at})
    assert taken == [True]
    with probe.read() as s:
        rows = s.connection().execute(sa.select(PROBE.c.id, PROBE.c.at).order_by(PROBE.c.id))
        assert [tuple(r) for r in rows] == [(i, datetime(2026, 12, 6, 8, 0, tzinfo=UTC))
                                            for i in range(3)]


OTHER = sa.Table("batch_probe_other", _META, sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("v", sa.Integer))
INSERT_OTHER = sa.insert(OTHER)


def _pipeline_states(probe: Database) -> tuple[list[str], Any]:
    """The driver's pipeline status as each statement of `probe`'s writer is sent."""
    seen: list[str] = []

    def note(conn: sa.Connection, *args: object) -> None:
        driver = conn.connection.driver_connection
        status = getattr(getattr(driver, "pgconn", None), "pipeline_status", None)
        seen.append("none" if status is None else pq.PipelineStatus(status).name)

    return seen, note


def test_a_flush_is_one_pipeline_on_postgresql(probe: Database) -> None:
    """On PostgreSQL the flush's statements are sent in one pipeline (psycopg's pipeline
    mode: each executemany no longer waits for the answers of the one before); SQLite has
    none. The rows are written as before."""
    seen, note = _pipeline_states(probe)
    sa.event.listen(probe.writer, "before_cursor_execute", note)
    try:
        with probe.write() as s, batch.deferred(s):
            batch.write(s, INSERT, {"id": 1, "a": "x"})
            batch.write(s, INSERT_OTHER, {"id": 1, "v": 10})
            batch.write(s, INSERT, {"id": 2, "a": "y", "b": "charge"})
    finally:
        sa.event.remove(probe.writer, "before_cursor_execute", note)
    flushed = seen[-3:]
    assert flushed == (["ON"] * 3 if not probe.is_sqlite else ["none"] * 3), seen
    with probe.read() as s:
        assert s.connection().execute(sa.select(sa.func.count()).select_from(PROBE)).scalar() == 2
        assert s.connection().execute(sa.select(OTHER.c.v)).scalar() == 10


def test_a_flush_that_fails_raises_sqlalchemys_error_and_writes_nothing(
        probe: Database) -> None:
    """A statement refused inside the pipeline is raised as SQLAlchemy raises a statement's
    error (IntegrityError here, its `orig` the driver's: what broker.store.conflicts and the
    guards' SYSTEMIC read), whether it surfaces at a later statement or at the pipeline's
    end; the transaction writes nothing."""
    with probe.write() as s:
        s.connection().execute(INSERT, {"id": 7, "a": "kept"})
    for later in (False, True):
        with pytest.raises(sa.exc.IntegrityError) as caught, probe.write() as s, \
                batch.deferred(s):
            batch.write(s, INSERT_OTHER, {"id": 1, "v": 1})
            batch.write(s, INSERT, {"id": 7, "a": "twice"})  # its primary key is taken
            if later:
                batch.write(s, INSERT, {"id": 8, "a": "after", "b": "other names"})
        assert getattr(caught.value.orig, "sqlstate", None) == (
            None if probe.is_sqlite else "23505")  # unique_violation
        with probe.read() as s:
            assert s.connection().execute(sa.select(PROBE.c.a)).scalars().all() == ["kept"]
            assert s.connection().execute(sa.select(OTHER.c.id)).all() == []


DEFAULTED = sa.Table("batch_probe_defaulted", _META,
                     sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("a", sa.String),
                     sa.Column("b", sa.String, default=lambda: "from python"))
INSERT_DEFAULTED = sa.insert(DEFAULTED)


@pytest.mark.parametrize("n", [1, 2])
def test_a_statement_the_plain_path_cannot_send_goes_through_sqlalchemy(
        probe: Database, n: int) -> None:
    """A statement with a default computed in Python is sent by SQLAlchemy (the plain path
    declines it), outside the flush's pipeline: a one-row insert reads its new key back at
    once, which a pipeline has not received yet. It is written beside the plain ones."""
    with probe.write() as s, batch.deferred(s):
        batch.write(s, INSERT, {"id": 1, "a": "plain"})
        for i in range(n):
            batch.write(s, INSERT_DEFAULTED, {"a": f"x{i}"})
    with probe.read() as s:
        got = s.connection().execute(sa.select(DEFAULTED.c.a, DEFAULTED.c.b)
                                     .order_by(DEFAULTED.c.a)).all()
        assert [tuple(r) for r in got] == [(f"x{i}", "from python") for i in range(n)]
        assert s.connection().execute(sa.select(PROBE.c.a)).scalars().all() == ["plain"]


def test_a_commits_counter_and_daily_sum_writes_go_by_the_plain_path(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writes a commit makes (the quota counters' upsert, the ledger's daily sums) are
    sent as the driver's executemany, their values converted by their types (a day on
    SQLite), and the rows are as SQLAlchemy's path wrote them."""
    taken: list[tuple[str, bool]] = []
    real = batch._executemany_plain

    def spy(conn: object, stmt: object, many: list[dict[str, object]]) -> bool:
        taken.append((str(stmt).split("(")[0].strip(), real(conn, stmt, many)))
        return taken[-1][1]

    monkeypatch.setattr(batch, "_executemany_plain", spy)
    at = datetime(2026, 12, 6, 23, 30, tzinfo=timezone(timedelta(hours=-2)))  # the 7th in UTC
    with db.write() as s:
        quota_counters.add(s, "vision", "a100", 4, 1)
        daily_sums.note(s, team="vision", flavor="a100", kind="usage", at=at, gpu_hours=2.0,
                        cost=None, pool="p", user="ann")
    assert taken == [("INSERT INTO quota_usage", True), ("INSERT INTO ledger_daily", True)]
    with db.read() as s:
        conn = s.connection()
        usage = conn.execute(sa.select(quota_counters.USAGE.c.reserved_gpus,
                                       quota_counters.USAGE.c.borrowed_gpus)).all()
        daily = conn.execute(sa.select(LEDGER_DAILY.c.dim, LEDGER_DAILY.c.day,
                                       LEDGER_DAILY.c.unpriced_gpu_hours)
                             .order_by(LEDGER_DAILY.c.dim)).all()
        assert daily_sums.mismatches(s) != []  # no entry row was written: only the sums
    assert [tuple(r) for r in usage] == [(4, 1)]
    assert [tuple(r) for r in daily] == [(d, date(2026, 12, 7), 2.0)
                                         for d in ("flavor", "pool", "team", "user")]


TYPED = sa.Table("batch_probe_typed", _META,
                 sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                 sa.Column("s", sa.String(4), nullable=True), sa.Column("flag", sa.Boolean),
                 sa.Column("x", sa.Float), sa.Column("day", sa.Date, nullable=True),
                 sa.Column("at", UTCDateTime, nullable=True))
INSERT_TYPED = sa.insert(TYPED)


def _typed_rows(probe: Database) -> list[tuple[Any, ...]]:
    with probe.read() as s:
        return [tuple(r) for r in s.connection().execute(
            sa.select(TYPED.c.id, TYPED.c.s, TYPED.c.flag, TYPED.c.x, TYPED.c.day, TYPED.c.at)
            .order_by(TYPED.c.id))]


@POSTGRES_ONLY
def test_on_postgresql_a_flushed_insert_is_one_statement_of_json_rows(probe: Database) -> None:
    """A plain insert's rows go as one JSON array in one statement (the same text for any
    number of rows); every type arrives as an executemany would store it, the serial keys in
    the order given."""
    at = datetime(2026, 12, 6, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    given: list[dict[str, Any]] = [
        {"s": "ab", "flag": True, "x": 0.1 + 0.2, "day": date(2026, 12, 6), "at": at},
        {"s": None, "flag": False, "x": -1e-300, "day": None, "at": None},
        {"s": "\u00e9\"\\'", "flag": True, "x": 3.0, "day": date(2027, 1, 1), "at": at}]
    with statements_sent(probe.writer) as sent, probe.write() as s, batch.deferred(s):
        for params in given:
            batch.write(s, INSERT_TYPED, params)
    typed = [(sql, n) for sql, n in sent if "batch_probe_typed" in sql]
    assert len(typed) == 1 and "jsonb_array_elements" in typed[0][0] and typed[0][1] == 3
    rows = _typed_rows(probe)  # by id: in the order given
    assert [r[1:] for r in rows] == [
        ("ab", True, 0.1 + 0.2, date(2026, 12, 6), at.astimezone(UTC)),
        (None, False, -1e-300, None, None),
        ("\u00e9\"\\'", True, 3.0, date(2027, 1, 1), at.astimezone(UTC))]


@POSTGRES_ONLY
def test_on_postgresql_a_value_too_long_is_refused_not_cut(probe: Database) -> None:
    with pytest.raises(sa.exc.DBAPIError, match="too long"), probe.write() as s, \
            batch.deferred(s):
        batch.write(s, INSERT_TYPED, {"s": "abcde", "flag": True, "x": 1.0, "day": None,
                                      "at": None})
    assert _typed_rows(probe) == []


@POSTGRES_ONLY
def test_nan_and_infinities_arrive_as_those_floats(probe: Database) -> None:
    with probe.write() as s, batch.deferred(s):
        for x in (float("nan"), float("inf"), float("-inf")):
            batch.write(s, INSERT_TYPED, {"s": "a", "flag": True, "x": x, "day": None,
                                          "at": None})
    xs = [r[3] for r in _typed_rows(probe)]
    assert xs[0] != xs[0] and xs[1:] == [float("inf"), float("-inf")]


BYTES = sa.Table("batch_probe_bytes", _META, sa.Column("id", sa.Integer, primary_key=True),
                 sa.Column("blob", sa.LargeBinary))
INSERT_BYTES = sa.insert(BYTES)


@POSTGRES_ONLY
def test_bytes_have_no_json_form_and_go_by_executemany(probe: Database) -> None:
    with statements_sent(probe.writer) as sent, probe.write() as s, batch.deferred(s):
        for i in range(2):
            batch.write(s, INSERT_BYTES, {"id": i, "blob": b"\\x41" * (i + 1)})
    [(sql, n)] = [(sql, n) for sql, n in sent if "batch_probe_bytes" in sql]
    assert "VALUES" in sql and n == 2
    with probe.read() as s:
        rows = s.connection().execute(sa.select(BYTES.c.blob).order_by(BYTES.c.id)).all()
    # as JSON text, the bytes \\x41 would be read back as the hex form of b"A"
    assert [r[0] for r in rows] == [b"\\x41", b"\\x41\\x41"]


@POSTGRES_ONLY
def test_a_too_long_value_of_a_real_table_is_refused_in_a_batch_as_alone(db: Database) -> None:
    """The store's tables declare their text columns through SQLModel (a decorator over
    VARCHAR(n)): a key longer than its column is refused inside a batch as it is alone,
    never cut to fit (two keys cut alike would collide on the unique key)."""
    at = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    for batched in (False, True):
        with pytest.raises(sa.exc.DBAPIError, match="too long") as caught, db.write() as s, \
                (batch.deferred(s) if batched else contextlib.nullcontext()):
            notices.add(s, key="k" * 200, kind="job", team="vision", at=at)
        assert getattr(caught.value.orig, "sqlstate", None) == "22001"
    with db.read() as s:
        assert s.connection().execute(sa.select(sa.func.count()).select_from(NOTICES)).scalar() == 0


@POSTGRES_ONLY
def test_a_whole_float_in_an_integer_column_is_stored_as_alone(db: Database) -> None:
    at = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    with db.write() as s, batch.deferred(s):
        notices.add(s, key="a", kind="job", team="vision", at=at, event_seq=2.0)  # type: ignore[arg-type]
    with db.read() as s:
        seqs = s.connection().execute(sa.select(NOTICES.c.event_seq)).scalars().all()
    assert seqs == [2]


UPDATE_TYPED = (sa.update(TYPED).where(TYPED.c.id == sa.bindparam("k"))
                .values(s=sa.bindparam("v_s"), flag=sa.bindparam("v_flag"),
                        x=sa.bindparam("v_x"), day=sa.bindparam("v_day"),
                        at=sa.bindparam("v_at")))
UPDATE_UNSET = (sa.update(TYPED).where(TYPED.c.id == sa.bindparam("k"), TYPED.c.s.is_(None))
                .values(s=sa.bindparam("v_s")))


def _typed_with(probe: Database, n: int) -> None:
    with probe.write() as s:
        for i in range(n):
            s.connection().execute(INSERT_TYPED, {"id": i, "s": None, "flag": False, "x": 0.0,
                                                  "day": None, "at": None})


def _updates(probe: Database, stmt: Any, given: list[dict[str, Any]], batched: bool
             ) -> list[tuple[str, int]]:
    with statements_sent(probe.writer) as sent, probe.write() as s, \
            (batch.deferred(s) if batched else contextlib.nullcontext()):
        for params in given:
            batch.write(s, stmt, params)
    return [(sql, n) for sql, n in sent if "batch_probe_typed" in sql]


@POSTGRES_ONLY
def test_on_postgresql_a_flushed_update_by_key_is_one_statement_and_the_last_write_wins(
        probe: Database) -> None:
    """Updates by key go as one statement of JSON rows and leave every row as the same
    updates one by one do: each type as written, NULLs, and a key written twice with the
    values of its last write."""
    at = datetime(2026, 12, 7, 12, 0, 0, 654321, tzinfo=timezone(timedelta(hours=-5)))
    given: list[dict[str, Any]] = [
        {"k": 2, "v_s": "ab", "v_flag": True, "v_x": 0.1 + 0.2, "v_day": date(2026, 12, 7),
         "v_at": at},
        {"k": 0, "v_s": "\u00e9\"\\'", "v_flag": True, "v_x": -1e-300, "v_day": None,
         "v_at": None},
        {"k": 2, "v_s": "cd", "v_flag": False, "v_x": 3.0, "v_day": date(2027, 1, 1),
         "v_at": at},
        {"k": 9, "v_s": "no", "v_flag": True, "v_x": 1.0, "v_day": None, "v_at": None}]
    ends = []
    for batched in (False, True):
        _typed_with(probe, 3)
        sent = _updates(probe, UPDATE_TYPED, given, batched)
        ends.append(_typed_rows(probe))
        with probe.write() as s:
            s.connection().execute(sa.delete(TYPED))
    assert len(sent) == 1 and sent[0][0].startswith("UPDATE") and "jsonb_array_elements" in \
        sent[0][0] and sent[0][1] == 3, sent  # the key given twice: once
    assert ends[1] == ends[0] == [
        (0, "\u00e9\"\\'", True, -1e-300, None, None), (1, None, False, 0.0, None, None),
        (2, "cd", False, 3.0, date(2027, 1, 1), at.astimezone(UTC))]


@POSTGRES_ONLY
def test_an_update_that_also_asks_a_column_is_null_goes_by_executemany_when_a_key_repeats(
        probe: Database) -> None:
    """Such an update matches a row only until the first of two writes to it sets the column:
    one statement would keep the last write, one by one keep the first. With each key once it
    is one statement still."""
    once = [{"k": 0, "v_s": "a"}, {"k": 1, "v_s": "b"}]
    twice = [{"k": 0, "v_s": "a"}, {"k": 0, "v_s": "z"}]
    _typed_with(probe, 2)
    [(sql, n)] = _updates(probe, UPDATE_UNSET, once, batched=True)
    assert "jsonb_array_elements" in sql and "IS NULL" in sql and n == 2
    assert [r[1] for r in _typed_rows(probe)] == ["a", "b"]
    with probe.write() as s:
        s.connection().execute(sa.update(TYPED).values(s=None))
    [(sql, n)] = _updates(probe, UPDATE_UNSET, twice, batched=True)
    assert "jsonb_array_elements" not in sql and n == 2
    assert [r[1] for r in _typed_rows(probe)] == ["a", None]


@POSTGRES_ONLY
def test_on_postgresql_an_update_with_a_value_too_long_is_refused_not_cut(
        probe: Database) -> None:
    _typed_with(probe, 1)
    with statements_sent(probe.writer) as sent, pytest.raises(sa.exc.DBAPIError,
                                                              match="too long"), \
            probe.write() as s, batch.deferred(s):
        batch.write(s, UPDATE_UNSET, {"k": 0, "v_s": "abcde"})
    assert any("jsonb_array_elements" in sql for sql, _ in sent)  # the one-statement path
    assert [r[1] for r in _typed_rows(probe)] == [None]


UPDATE_FROM = (sa.update(TYPED).where(TYPED.c.id == sa.bindparam("k"),
                                      TYPED.c.s == sa.bindparam("old"))
               .values(s=sa.bindparam("new")))


@POSTGRES_ONLY
def test_an_update_that_matches_on_a_column_it_sets_writes_each_row_in_turn(
        probe: Database) -> None:
    """A -> B, then B -> C: one by one the second write matches what the first wrote. As
    one statement both would be matched against A, and the row would end at B."""
    _typed_with(probe, 1)
    with probe.write() as s:
        s.connection().execute(sa.update(TYPED).values(s="A"))
    _updates(probe, UPDATE_FROM, [{"k": 0, "old": "A", "new": "B"},
                                  {"k": 0, "old": "B", "new": "C"}], batched=True)
    assert [r[1] for r in _typed_rows(probe)] == ["C"]


UPSERT_PROBE = sa.text("INSERT INTO batch_probe (id, a, b) VALUES (:i, :a, :b) "
                       "ON CONFLICT (id) DO UPDATE SET a = excluded.a, b = excluded.b")
batch.upsert_rows(UPSERT_PROBE, PROBE, keys=("i",), last_wins=True)
APPEND_PROBE = sa.text("INSERT INTO batch_probe (id, a) VALUES (:i, :a) "
                       "ON CONFLICT (id) DO UPDATE SET a = batch_probe.a || excluded.a")
batch.upsert_rows(APPEND_PROBE, PROBE, keys=("i",), last_wins=False)


def _probe_rows(probe: Database) -> list[tuple[Any, ...]]:
    with probe.read() as s:
        return [tuple(r) for r in s.connection().execute(
            sa.select(PROBE.c.id, PROBE.c.a, PROBE.c.b).order_by(PROBE.c.id))]


def _upserted(probe: Database, stmt: Any, given: list[dict[str, Any]], batched: bool
              ) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
    with probe.write() as s:
        s.connection().execute(sa.delete(PROBE))
        s.connection().execute(INSERT, {"id": 1, "a": "x", "b": "old"})
    with statements_sent(probe.writer) as sent, probe.write() as s, \
            (batch.deferred(s) if batched else contextlib.nullcontext()):
        for params in given:
            batch.write(s, stmt, params)
    return [(sql, n) for sql, n in sent if "batch_probe" in sql], _probe_rows(probe)


@POSTGRES_ONLY
def test_on_postgresql_a_declared_upsert_is_one_statement_and_a_key_given_twice_keeps_its_last(
        probe: Database) -> None:
    given = [{"i": 2, "a": "p", "b": None}, {"i": 1, "a": "q", "b": "r"},
             {"i": 2, "a": "s", "b": "t"}]
    _, alone = _upserted(probe, UPSERT_PROBE, given, batched=False)
    sent, batched = _upserted(probe, UPSERT_PROBE, given, batched=True)
    assert batched == alone == [(1, "q", "r"), (2, "s", "t")]
    assert len(sent) == 1 and "jsonb_array_elements" in sent[0][0] and sent[0][1] == 2, sent


@POSTGRES_ONLY
def test_an_upsert_that_adds_to_a_key_given_twice_goes_by_executemany(probe: Database) -> None:
    """One statement may not change a row twice (PostgreSQL refuses it), and keeping one of
    the two rows would lose the other's addition."""
    given = [{"i": 1, "a": "y"}, {"i": 1, "a": "z"}]
    _, alone = _upserted(probe, APPEND_PROBE, given, batched=False)
    sent, batched = _upserted(probe, APPEND_PROBE, given, batched=True)
    assert batched == alone == [(1, "xyz", "old")]
    assert len(sent) == 1 and "jsonb_array_elements" not in sent[0][0] and sent[0][1] == 2


def test_only_an_upsert_of_the_table_named_with_its_columns_paired_is_declared() -> None:
    with pytest.raises(ValueError, match="not an upsert of batch_probe"):
        batch.upsert_rows(sa.text("INSERT INTO other (id) VALUES (:i) ON CONFLICT DO NOTHING"),
                          PROBE, keys=("i",), last_wins=True)
    for values in ("(:i)", "(:i, :i)", "(:i, a)"):
        with pytest.raises(ValueError, match="do not pair up"):
            batch.upsert_rows(sa.text(f"INSERT INTO batch_probe (id, a) VALUES {values} "
                                      "ON CONFLICT (id) DO UPDATE SET a = excluded.a"),
                              PROBE, keys=("i",), last_wins=True)
    with pytest.raises(ValueError, match="literals"):
        batch.upsert_rows(sa.text("INSERT INTO batch_probe (id, a) VALUES (:i, :a) "
                                  "ON CONFLICT (id) DO UPDATE SET a = excluded.a || '%'"),
                          PROBE, keys=("i",), last_wins=True)
    with pytest.raises(ValueError, match="sets the new values"):
        batch.upsert_rows(sa.text("INSERT INTO batch_probe (id, a) VALUES (:i, :a) "
                                  "ON CONFLICT (id) DO NOTHING"), PROBE, keys=("i",),
                          last_wins=True)
