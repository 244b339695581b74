"""The quota ledger on both databases: idempotent entries, counters equal to the entries."""

from __future__ import annotations

import pytest

from broker import ledger
from broker.domain import JobState, Reason
from broker.ledger import LedgerKind, Reservation
from broker.store import Database, utcnow
from tests.builders import insert_job_in_state


def _job(db: Database) -> str:
    with db.write() as s:
        return insert_job_in_state(s, JobState.ADMITTED, Reason.Admitted)


def test_reserve_and_release_are_idempotent(db: Database) -> None:
    job = _job(db)
    r = Reservation(job, 1, "vision", "h100-80g", 16, borrowed_gpus=8)
    with db.write() as s:
        assert ledger.reserve(s, r, utcnow()) is True
        assert ledger.reserve(s, r, utcnow()) is False
        assert ledger.usage(s) == {("vision", "h100-80g"): (16, 8)}
    with db.write() as s:
        assert ledger.release(s, job, 1, utcnow()) is True
        assert ledger.release(s, job, 1, utcnow()) is False
        assert ledger.release(s, job, 2, utcnow()) is False  # never reserved
        assert ledger.usage(s) == {("vision", "h100-80g"): (0, 0)}
        assert ledger.check(s) == []


def _counter(db: Database) -> tuple[int, int]:
    with db.read() as s:
        row = s.connection().exec_driver_sql(
            "SELECT reserved_gpus, borrowed_gpus FROM quota_usage").one()
    return int(row[0]), int(row[1])


def test_counters_are_written_at_commit_without_a_rolled_back_savepoints_changes(
    db: Database,
) -> None:
    """Releases note their counter change; the commit writes the sum (a reconcile chunk
    undoes one attempt's savepoint alone: its release must not count)."""
    jobs = [_job(db) for _ in range(3)]
    with db.write() as s:
        for job in jobs:
            ledger.reserve(s, Reservation(job, 1, "vision", "h100-80g", 8, 2), utcnow())
    assert _counter(db) == (24, 6)
    with db.write() as s:
        with s.begin_nested():
            assert ledger.release(s, jobs[0], 1, utcnow())
        with pytest.raises(RuntimeError), s.begin_nested():
            assert ledger.release(s, jobs[1], 1, utcnow())
            raise RuntimeError("this attempt failed: its savepoint is undone")
        with s.begin_nested(), s.begin_nested():  # released, then its outer savepoint undone
            assert ledger.release(s, jobs[2], 1, utcnow())
            s.get_nested_transaction().parent.rollback()  # type: ignore[union-attr]
        assert ledger.usage(s) == {("vision", "h100-80g"): (16, 4)}  # this transaction's view
        assert _counter(db) == (24, 6)  # not written before the commit
    assert _counter(db) == (16, 4)
    with db.write() as s:
        assert ledger.check(s) == []
    with pytest.raises(RuntimeError), db.write() as s:
        ledger.release(s, jobs[1], 1, utcnow())
        raise RuntimeError("the whole transaction is undone")
    assert _counter(db) == (16, 4)


def test_hours_recorded_once_per_attempt_and_kind(db: Database) -> None:
    job = _job(db)
    r = Reservation(job, 1, "vision", "a100-80g", 8)
    with db.write() as s:
        assert ledger.record_hours(s, r, LedgerKind.USAGE, 2.5, utcnow())
        assert not ledger.record_hours(s, r, LedgerKind.USAGE, 2.5, utcnow())
        assert ledger.record_hours(s, r, LedgerKind.WASTE, 0.5, utcnow())
        with pytest.raises(ValueError, match="usage or waste"):
            ledger.record_hours(s, r, LedgerKind.RESERVE, 1, utcnow())


def test_entries_are_append_only_and_check_finds_a_tampered_counter(db: Database) -> None:
    job = _job(db)
    with db.write() as s:
        ledger.reserve(s, Reservation(job, 1, "vision", "h100-80g", 16), utcnow())
    with pytest.raises(Exception, match="append-only"), db.write() as s:
        s.connection().exec_driver_sql("DELETE FROM ledger_entries")
    with db.write() as s:
        s.connection().exec_driver_sql("UPDATE quota_usage SET reserved_gpus = 99")
    with db.read() as s:
        assert ledger.check(s) == [
            "quota_usage vision/h100-80g: counter (99, 0) != entries (16, 0)"
        ]
