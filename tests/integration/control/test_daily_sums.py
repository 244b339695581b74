"""The ledger's daily sums (ledger_daily) written by the application at commit (revision 0013)
equal the sums of the entries after mixed writes: the control loop's own bookings, charges in
savepoints released and rolled back, an entry without a pool or user, a transaction rolled
back whole, a bulk load that adds its own sums; `isthmus db check` finds a drifted row; on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import Session
from typer.testing import CliRunner

from broker import ledger
from broker.cli.main import app
from broker.store import daily_sums
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from tests.builders import spec
from tests.harness.sim import Sim, run_until, submit

DAY = datetime(2026, 11, 27, 23, 30, tzinfo=UTC)


def _charge(s: Session, job: str, attempt: int, at: datetime, ending: ledger.Ending) -> None:
    held = ledger.Held(gpus=8, since=at - timedelta(hours=2), until=at,
                       running=at - timedelta(hours=1), progress=at - timedelta(minutes=20))
    r = ledger.Reservation(job, attempt, "language", "a100-80g", 8)
    assert ledger.charge(s, r, held, ending, 1.5, at)


def _hours_entries(s: Session) -> tuple[int, int]:
    """(hours entries in the ledger, entries summed in ledger_daily under dim team)."""
    conn = s.connection()
    entries = conn.execute(sa.select(sa.func.count()).select_from(ENTRIES).where(
        ENTRIES.c.kind.not_in(daily_sums.NOT_HOURS))).scalar_one()
    summed = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(DAILY.c.entries), 0))
                          .where(DAILY.c.dim == "team")).scalar_one()
    return int(entries), int(summed)


def _mixed_writes(sim: Sim, job: str) -> None:
    with sim.plane.db.write() as s:
        with s.begin_nested():  # released: kept
            _charge(s, job, 2, DAY, ledger.Ending.FAILED)
        savepoint = s.begin_nested()
        _charge(s, job, 3, DAY + timedelta(hours=1), ledger.Ending.LOST)
        savepoint.rollback()  # its entries are gone: so must its sums be
        r = ledger.Reservation(job, 4, "language", "a100-80g", 8)  # no attempt 4: pool ''
        assert ledger.record_hours(s, r, ledger.LedgerKind.WASTE, 0.75, DAY)
    with pytest.raises(RuntimeError), sim.plane.db.write() as s:
        _charge(s, job, 5, DAY, ledger.Ending.CANCELLED)
        raise RuntimeError("the transaction fails after its charge")
    with sim.plane.db.write() as s:  # a bulk load: entries inserted, then their sums added
        s.connection().execute(sa.insert(ENTRIES), [
            {"job_id": job, "attempt": 6, "kind": "usage", "team": "vision", "flavor": "f",
             "gpus": 1, "borrowed_gpus": 0, "gpu_hours": 3.0, "at": DAY, "note": "",
             "cost": None, "pool": None, "submitted_by": "bulk"}])
        daily_sums.add_entries(s, ENTRIES.c.attempt == 6)


def test_daily_sums_equal_the_entries_after_mixed_writes(sim: Sim) -> None:
    job = submit(sim, spec().team("language").flavors("a100-80g").replicas(1).gpus(8), 120)
    run_until(sim, job, "SUCCEEDED")  # booked by the control loop itself
    _mixed_writes(sim, job)
    with sim.plane.db.read() as s:
        assert daily_sums.mismatches(s) == []
        entries, summed = _hours_entries(s)
        attempts = {r.attempt for r in s.connection().execute(
            sa.select(ENTRIES.c.attempt).where(ENTRIES.c.job_id == job))}
        pools = {r.value for r in s.connection().execute(
            sa.select(DAILY.c.value).where(DAILY.c.dim == "pool"))}
    assert attempts == {1, 2, 4, 6} and entries == summed >= 6
    assert "" in pools and len(pools) >= 2  # the entry without an attempt; the loop's pool


def test_db_check_reports_a_drifted_daily_sum_and_rebuild_sums_mends_it(sim: Sim) -> None:
    job = submit(sim, spec().team("language").flavors("a100-80g").replicas(1).gpus(8), 120)
    run_until(sim, job, "SUCCEEDED")
    runner = CliRunner()
    ok = runner.invoke(app, ["db", "check", "--db", sim.plane.db.url])
    assert ok.exit_code == 0, ok.output
    with sim.plane.db.write() as s:
        s.connection().execute(DAILY.update().where(DAILY.c.dim == "user").values(
            gpu_hours=DAILY.c.gpu_hours + 1.0))
    bad = runner.invoke(app, ["db", "check", "--db", sim.plane.db.url])
    assert bad.exit_code == 1, bad.output
    assert "ledger_daily user/" in bad.output and "gpu_hours -1" in bad.output
    with sim.plane.db.write() as s:  # and a row lost: entries booked without their sums
        s.connection().execute(DAILY.delete().where(DAILY.c.dim == "team"))
    fixed = runner.invoke(app, ["db", "rebuild-sums", "--db", sim.plane.db.url, "--json"])
    assert fixed.exit_code == 0, fixed.output
    assert json.loads(fixed.output)["ledger_daily_rows"] >= 4  # a row per grouping at least
    again = runner.invoke(app, ["db", "check", "--db", sim.plane.db.url])
    assert again.exit_code == 0, again.output
