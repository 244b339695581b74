"""The ledger's daily sums (ledger_daily) are written at a transaction's commit, so a charge
no longer holds the day's shared rows from the middle of its transaction. Before (revision
0011's trigger), a reconcile chunk (job A charged, the team's day rows taken; then job B's
row) and another writer charging B under B's row lock (B's row; then the day rows) took the
rows in opposite orders and PostgreSQL aborted one of them as a deadlock victim."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from broker import ledger
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.orchestration.submission import submit_job
from broker.store import daily_sums, records
from broker.store.tables import LEDGER_DAILY as DAILY
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

pytestmark = POSTGRES_ONLY  # row-lock order matters only where rows are locked

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _charge(s: object, job: str) -> None:
    """Job's attempt 1 failed after an hour on 16 GPUs: usage and two waste entries, each
    added to the team's (and flavor's, and user's) rows of the day."""
    held = ledger.Held(gpus=16, since=NOW - timedelta(hours=1), until=NOW,
                       running=NOW - timedelta(minutes=50))
    r = ledger.Reservation(job, 1, "vision", "h100-80g", 16)
    assert ledger.charge(s, r, held, ledger.Ending.FAILED, 1.0, NOW)  # type: ignore[arg-type]


def test_two_charges_of_one_team_and_day_under_other_locks_do_not_deadlock(sim: Sim) -> None:
    one = spec().flavors("h100-80g").build()
    a = submit_job(sim.plane.db, sim.plane.config, one, "t").job.id
    b = submit_job(sim.plane.db, sim.plane.config, one, "t").job.id
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 2
    done: list[object] = []

    def charge_b() -> None:  # another writer: B's row, then B's charge
        try:
            with sim.plane.db.write() as s:
                assert records.lock_job(s, b) is not None
                _charge(s, b)
            done.append("committed")
        except BaseException as exc:  # reported by the assertion below
            done.append(exc)

    other = threading.Thread(target=charge_b)
    with sim.plane.db.write() as s:  # what a reconcile chunk does: A charged, then B's row
        assert records.lock_job(s, a) is not None
        _charge(s, a)
        other.start()  # before: B's charge waited for the day rows this transaction held
        wait_until(lambda: done or lock_waiters(sim.plane.db) >= 1, 60,
                   "the other charge to end or to wait on a lock")
        assert records.lock_job(s, b) is not None  # before: a lock-order cycle, one aborted
    other.join(timeout=60)
    assert not other.is_alive()
    assert done == ["committed"], done
    with sim.plane.db.read() as s:
        assert daily_sums.mismatches(s) == []
        rows = s.connection().execute(DAILY.select().where(
            DAILY.c.dim == "team", DAILY.c.kind == "usage")).all()
    assert [(r.value, r.entries, r.gpu_hours) for r in rows] == [("vision", 2, 32.0)]
