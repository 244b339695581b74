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
