"""Revision 0012: the reconciler's narrow read (attempts.dispatched_brief) is answered from
two covering indexes, the live attempts' in id order and the jobs' lifecycle columns, on
SQLite and PostgreSQL; and it returns what the tables hold."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.store import attempts as att
from broker.store import cause_lookups, in_lists, ledger_lookups, queries
from broker.store.db import Database, connect
from broker.store.migrate import upgrade
from broker.store.records import JOBS

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _job(i: int, state: str) -> dict[str, object]:
    return {"id": f"J{i:015d}", "name": f"j{i}", "team": "t", "queue": "default",
            "priority": "normal", "state": state, "reason": f"R{i}", "message": "",
            "attempt": 2, "last_seq": 1, "total_gpus": 1, "spec_json": "{}",
            "spec_hash": "x" * 64, "submitted_by": "u", "created_at": T0, "updated_at": T0,
            "exclude_json": "{}"}


def _attempt(i: int, number: int, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {
        "job_id": f"J{i:015d}", "number": number, "snapshot_json": "{}", "spec_hash": "x" * 64,
        "backend_name": f"isthmus-{i}-{number}", "created_at": T0, "backend": "sim",
        "pool": "p", "flavor": "f", "gpus": 1, "dispatch": "created", "phase": "RUNNING",
        "preempted": False, "ended_at": None}
    return row | kw


def _seed(db: Database) -> None:
    with db.write() as s:
        c = s.connection()
        c.execute(sa.insert(JOBS), [_job(i, "RUNNING") for i in range(6)])
        c.execute(sa.insert(att.ATTEMPTS), [
            _attempt(0, 1, ended_at=T0, phase="FAILED"), _attempt(0, 2),
            _attempt(1, 2, dispatch="pending"), _attempt(2, 2, backend="other"),
            _attempt(3, 2, phase="STARTING"), _attempt(4, 1), _attempt(5, 2),
        ])


def test_the_narrow_read_returns_the_live_dispatched_attempts_in_order(db: Database) -> None:
    _seed(db)
    with db.read() as s:
        got = att.dispatched_brief(s, "sim")
    assert [(b.job_id[-1], b.number, b.phase, b.job_state, b.job_reason, b.job_attempt)
            for b in got] == [("0", 2, "RUNNING", "RUNNING", "R0", 2),
                              ("3", 2, "STARTING", "RUNNING", "R3", 2),
                              ("4", 1, "RUNNING", "RUNNING", "R4", 2),
                              ("5", 2, "RUNNING", "RUNNING", "R5", 2)]


def test_the_narrow_read_is_covered_by_the_indexes(db: Database) -> None:
    _seed(db)
    stmt = att.brief_statement(db.writer.dialect.name)
    with db.write() as s:
        c = s.connection()
        if db.is_sqlite:
            sql = str(stmt.compile(dialect=c.dialect))
            plan = " / ".join(r[3] for r in c.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {sql}", ("sim", "created")))
            assert "USING COVERING INDEX ix_attempts_reconcile" in plan, plan
            assert "USING COVERING INDEX ix_jobs_lifecycle" in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # no sort: the index is in id order
            return
        c.exec_driver_sql("SET LOCAL enable_seqscan = off")
        sql = stmt.params(backend="sim").compile(dialect=c.dialect,
                                                 compile_kwargs={"literal_binds": True})
        plan = " / ".join(r[0] for r in c.exec_driver_sql(f"EXPLAIN {sql}"))
        assert "Index Only Scan using ix_attempts_reconcile" in plan, plan
        assert "Sort" not in plan, plan
        defs: dict[str, str] = {r[0]: r[1] for r in c.exec_driver_sql(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
            "('ix_attempts_reconcile', 'ix_jobs_lifecycle')")}
        assert "WHERE (ended_at IS NULL)" in defs["ix_attempts_reconcile"]
        assert "(id, state, reason, attempt)" in defs["ix_jobs_lifecycle"]


@pytest.mark.parametrize("stmt, name, pairs", [
    (att._BY_KEYS, "keys", [("J000000000000003", 2), ("J000000000000005", 2)]),
    (att._SNAPSHOTS, "keys", [("J000000000000003", 2), ("J000000000000005", 2)]),
    (ledger_lookups._ENTRIES_OF, "keys", [("J000000000000003", 2), ("J000000000000005", 2)]),
    (cause_lookups._EVENTS_OF, "pairs", [("J000000000000003", "fact:1:0"),
                                         ("J000000000000005", "fact:2:0")]),
    (ledger._RESERVATIONS_OF, "keys", [("J000000000000003", 2), ("J000000000000005", 2)]),
], ids=["attempts-by-key", "snapshots", "ledger-read-ahead", "cause-read-ahead",
        "ledger-borrowed"])
def test_lookups_by_pairs_search_an_index_on_sqlite(  # two pairs: one is an equality
    tmp_path: Path, stmt: Any, name: str, pairs: list[Any],
) -> None:
    """A row-value IN list alone made SQLite read the whole table (attempts, ledger entries,
    events: a pass's look-ups cost more as the history grew); with the pairs' first values as
    a plain IN list beside it, it searches the table's index, and still returns the pairs."""
    db = connect(f"sqlite:///{tmp_path / 'plan.db'}")
    upgrade(db)
    _seed(db)
    params = in_lists.pair_params(name, pairs)
    with db.read() as s:
        c = s.connection()
        expanded = stmt.compile(dialect=c.dialect).construct_expanded_state(params)
        plan = [r[3] for r in c.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {expanded.statement}",
            tuple(expanded.parameters[p] for p in expanded.positiontup or ()))]
        tables = [step for step in plan if "CONSTANT ROW" not in step
                  and not step.startswith("LIST SUBQUERY")]
        assert tables and all(step.startswith("SEARCH") for step in tables), plan
        got = c.execute(stmt, params).all()
    db.dispose()
    if stmt is att._BY_KEYS:
        assert sorted((r.job_id, r.number) for r in got) == sorted(pairs)


def _plan(c: Any, stmt: Any) -> list[str]:
    sql = str(stmt.compile(dialect=c.dialect, compile_kwargs={"literal_binds": True}))
    plan = [r[3] for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
    return [step for step in plan if "CONSTANT ROW" not in step
            and not step.startswith("LIST SUBQUERY")]


def test_the_submit_look_up_by_pairs_searches_the_unique_index_on_sqlite(
        tmp_path: Path) -> None:
    """The API's idempotency look-up (every submit): the same row-value IN pattern and table
    scan as above; the teams alone would search a team's jobs, so the keys go beside them."""
    db = connect(f"sqlite:///{tmp_path / 'plan.db'}")
    upgrade(db)
    with db.write() as s:
        s.connection().execute(sa.insert(JOBS), [
            _job(0, "RUNNING") | {"idempotency_key": "k1"},
            _job(1, "RUNNING") | {"idempotency_key": "k2"},
            _job(2, "RUNNING") | {"team": "u", "idempotency_key": "k1"},
        ])
    pairs = [("t", "k2"), ("u", "k1"), ("u", "k2")]
    params = queries._key_params(pairs)
    with db.read() as s:
        c = s.connection()
        expanded = queries._BY_KEYS.compile(dialect=c.dialect).construct_expanded_state(params)
        steps = [r[3] for r in c.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {expanded.statement}",
            tuple(expanded.parameters[p] for p in expanded.positiontup or ()))
            if "CONSTANT ROW" not in r[3] and not r[3].startswith("LIST SUBQUERY")]
        assert steps and all(step.startswith("SEARCH") for step in steps), steps
        assert any("(team=? AND idempotency_key=?)" in step for step in steps), steps
        got = sorted((r.team, r.idempotency_key) for r in c.execute(queries._BY_KEYS, params))
    db.dispose()
    assert got == [("t", "k2"), ("u", "k1")]  # exactly the pairs asked: ("t", "k1") is not


def test_the_repairs_look_up_is_one_range_of_its_partial_index(db: Database) -> None:
    """The retry repair's look-up (requeue.repair_undecided, every minute) reads the partial
    index made for it (revision 0014), on both databases: SQLAlchemy's `preempted = 1` (its
    SQLite form of the boolean column) did not match the index's `preempted`, and SQLite
    scanned every attempt ever made instead. It still finds exactly the undecided ones."""
    _seed(db)
    with db.write() as s:
        c = s.connection()
        c.execute(sa.insert(att.ATTEMPTS), [
            _attempt(1, 1, ended_at=T0, phase="PREEMPTED", preempted=True),
            _attempt(2, 1, ended_at=T0, phase="SUCCEEDED", retry_decision="none"),
            _attempt(3, 1, ended_at=T0, phase="SUCCEEDED"),
        ])
    with db.write() as s:
        c = s.connection()
        if db.is_sqlite:
            plan = _plan(c, att._UNDECIDED.limit(500))
            assert plan == ["SCAN attempts USING INDEX ix_attempts_undecided"], plan
        else:
            c.exec_driver_sql("SET LOCAL enable_seqscan = off")
            sql = att._UNDECIDED.limit(500).compile(dialect=c.dialect,
                                                    compile_kwargs={"literal_binds": True})
            pg_plan = " / ".join(r[0] for r in c.exec_driver_sql(f"EXPLAIN {sql}"))
            assert "ix_attempts_undecided" in pg_plan, pg_plan
        got = att.undecided(s)
    assert got == [("J000000000000001", 1)], got  # 0's first attempt: no failure recorded
