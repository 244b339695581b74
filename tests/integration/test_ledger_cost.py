"""Revision 0007 on both databases: ledger_entries gains a nullable numeric cost; rows from
before keep NULL, the append-only triggers survive, and `charge` prices what it books."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.domain import JobState, Reason
from broker.store import migrate, open_database, utcnow
from broker.store.records import JOBS


def test_upgrade_adds_cost_keeps_old_rows_and_the_append_only_guard(empty_url: str) -> None:
    db = open_database(empty_url, migrate=False)
    try:
        migrate.upgrade(db, "0006")
        job = "J000000000000001"
        with db.write() as s:
            now = utcnow()
            # the columns revision 0006 knew (the job row of today's code has later ones)
            s.connection().execute(sa.insert(JOBS), [{
                "id": job, "name": "j", "team": "vision", "queue": "default",
                "priority": "normal", "state": JobState.ADMITTED.value,
                "reason": Reason.Admitted.value, "message": "", "attempt": 1, "last_seq": 1,
                "total_gpus": 8, "spec_json": "{}", "spec_hash": "x" * 64,
                "submitted_by": "u", "created_at": now, "updated_at": now,
                "exclude_json": "{}"}])
            s.connection().exec_driver_sql(  # the code of revision 0006 knew no cost column
                "INSERT INTO ledger_entries (job_id, attempt, kind, team, flavor, gpus, "
                "borrowed_gpus, gpu_hours, at, note) VALUES (%s, 1, 'usage', 'vision', "
                "'h100-80g', 8, 0, 1.5, %s, 'cost 2')".replace(
                    "%s", "?" if db.is_sqlite else "%s"), (job, utcnow()))
        migrate.upgrade(db)
        now = utcnow()
        held = ledger.Held(gpus=8, since=now - timedelta(hours=2), until=now,
                           running=now - timedelta(hours=1))
        with db.write() as s:
            booked = ledger.charge(s, ledger.Reservation(job, 2, "vision", "h100-80g", 8),
                                   held, ledger.Ending.SUCCEEDED, 3.0, now)
        assert booked == {ledger.LedgerKind.USAGE: pytest.approx(16.0),
                          ledger.LedgerKind.WASTE_PREPARING: pytest.approx(8.0)}
        with db.read() as s:
            rows = {(a, k): c for a, k, c in s.connection().exec_driver_sql(
                "SELECT attempt, kind, cost FROM ledger_entries").all()}
        assert rows[(1, "usage")] is None  # written before 0007
        assert rows[(2, "usage")] == pytest.approx(48.0)
        assert rows[(2, "waste:preparing")] == pytest.approx(24.0)
        with pytest.raises(Exception, match="append-only"), db.write() as s:
            s.connection().exec_driver_sql("UPDATE ledger_entries SET cost = 0")
    finally:
        db.dispose()


@pytest.mark.parametrize(("ending", "waste"), [
    pytest.param(ledger.Ending.SUCCEEDED, {"waste:preparing": 1.0}, id="succeeded"),
    pytest.param(ledger.Ending.FAILED, {"waste:preparing": 1.0, "waste:failed": 3.0},
                 id="failed-whole-run"),
    pytest.param(ledger.Ending.PREEMPTED, {"waste:preparing": 1.0, "waste:preempted": 1.0},
                 id="preempted-since-progress"),
    pytest.param(ledger.Ending.CANCELLED, {"waste:preparing": 1.0, "waste:cancelled": 1.0},
                 id="cancelled-since-progress"),
    pytest.param(ledger.Ending.LOST, {"waste:preparing": 1.0, "waste:lost": 1.0},
                 id="lost-since-progress"),
])
def test_split_by_ending(ending: ledger.Ending, waste: dict[str, float]) -> None:
    t0 = utcnow()
    held = ledger.Held(gpus=1, since=t0, until=t0 + timedelta(hours=4),
                       running=t0 + timedelta(hours=1), progress=t0 + timedelta(hours=3))
    got = {k.value: v for k, v in ledger.split(held, ending).items()}
    assert got == {"usage": pytest.approx(4.0), **{k: pytest.approx(v) for k, v in waste.items()}}


def test_split_never_charges_what_was_not_held() -> None:
    t0 = utcnow()
    assert ledger.split(ledger.Held(8, None, t0), ledger.Ending.CANCELLED) == {
        ledger.LedgerKind.USAGE: 0.0}
    # times outside the held interval are clamped into it
    held = ledger.Held(2, t0, t0 + timedelta(hours=1), running=t0 - timedelta(hours=5),
                       progress=t0 + timedelta(hours=9))
    got = ledger.split(held, ledger.Ending.PREEMPTED)
    assert got == {ledger.LedgerKind.USAGE: pytest.approx(2.0)}
