"""The daily sums of the ledger (ledger_daily, written at commit, revision 0013) stay equal to
the ledger's entries: over a mixed workload (the simulated federation's own bookings, then
attempts of every ending booked across several days, entries without a pool or user as before
revision 0010, unpriced ones as before 0007), every usage report, by every grouping, over
whole days, partial days at either edge, windows inside one day and open windows, equals the
same report summed from the raw entries; on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.orchestration.submission import cancel_job
from broker.store import daily_sums
from broker.store.reports import GROUPS, GroupBy, hours_by, hours_series
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from broker.views.usage import UsageReport, usage_report
from tests.builders import spec
from tests.harness.sim import Sim, run_until, submit

DAY0 = datetime(2026, 11, 2, tzinfo=UTC)
ENDINGS = list(ledger.Ending)


def _sim_bookings(sim: Sim) -> list[str]:
    """A success and a cancel while running, booked by the control loop itself."""
    ok = submit(sim, spec().team("vision").flavors("h100-80g").replicas(2).gpus(8), 120)
    gone = submit(sim, spec().team("language").flavors("a100-80g").replicas(1).gpus(8)
                  .topology(None), 3600)
    run_until(sim, gone, "RUNNING", step=20)
    cancel_job(sim.plane.db, gone, "lars", by_admin=False)
    run_until(sim, ok, "SUCCEEDED")
    run_until(sim, gone, "CANCELLED")
    return [ok, gone]


def _booked_over_days(sim: Sim, jobs: list[str], rng: random.Random) -> None:
    """Attempts 2.. of the jobs (no attempt rows: their pool is unknown) booked through
    `ledger.charge` at random times over five days, every ending, two teams and flavors; some
    entries written as older revisions did (no pool, user or cost; one unsplit waste)."""
    with sim.plane.db.write() as s:
        for n in range(2, 42):
            job = jobs[n % len(jobs)]
            team, flavor = (("vision", "h100-80g"), ("language", "a100-80g"))[n % 2]
            end = DAY0 + timedelta(seconds=rng.randrange(5 * 86400))
            if n % 10 == 0:
                end = DAY0 + timedelta(days=n // 10)  # exactly midnight: the day it starts
            held = ledger.Held(gpus=8 * (1 + n % 3), since=end - timedelta(hours=rng.uniform(
                0.1, 30)), until=end, running=end - timedelta(minutes=rng.uniform(1, 300)),
                progress=end - timedelta(minutes=rng.uniform(1, 120)))
            r = ledger.Reservation(job, n, team, flavor, held.gpus)
            if n % 9 == 0:  # booked before revision 0007: usage without a cost
                ledger.record_hours(s, r, ledger.LedgerKind.USAGE, rng.uniform(0, 50), end)
                continue
            ledger.charge(s, r, held, ENDINGS[n % len(ENDINGS)], rng.uniform(0.5, 3), end)
            if n % 7 == 0:  # waste unsplit, as before revision 0007
                ledger.record_hours(s, r, ledger.LedgerKind.WASTE, rng.uniform(0, 5), end)
        before = s.connection().execute(sa.select(sa.func.max(ENTRIES.c.id))).scalar_one()
        s.connection().execute(sa.text(
            "INSERT INTO ledger_entries (job_id, attempt, kind, team, flavor, gpus, "
            "borrowed_gpus, gpu_hours, at, note) SELECT job_id, number, 'waste', 'vision', "
            "flavor, gpus, 0, 2.5, ended_at, '' FROM attempts WHERE job_id = :j"),
            {"j": jobs[0]})
        daily_sums.add_entries(s, ENTRIES.c.id > before)  # a bulk load adds its own sums


def _windows(rng: random.Random) -> list[tuple[datetime | None, datetime | None]]:
    midnight = [DAY0 + timedelta(days=d) for d in range(-1, 7)]
    fixed: list[tuple[datetime | None, datetime | None]] = [
        (None, None), (midnight[1], midnight[4]), (midnight[0], midnight[7]),
        (midnight[2] + timedelta(hours=5), midnight[5] + timedelta(hours=1)),  # both edges
        (midnight[2] + timedelta(hours=5), midnight[2] + timedelta(hours=9)),  # one day
        (midnight[2] + timedelta(hours=23), midnight[3] + timedelta(hours=2)),  # across one
        (None, midnight[3] + timedelta(minutes=7)), (midnight[3] - timedelta(seconds=1), None),
    ]
    for _ in range(12):
        a = DAY0 + timedelta(seconds=rng.randrange(-86400, 6 * 86400))
        fixed.append((a, a + timedelta(seconds=rng.randrange(1, 4 * 86400))))
    return fixed


def _report(sim: Sim, by: GroupBy, window: tuple[datetime | None, datetime | None],
            team: str | None, daily: bool) -> UsageReport:
    with sim.plane.db.read() as s:
        rows = list(hours_by(s, by, *window, team, daily=daily))
    return usage_report(rows, by, *window, team)


def _same(a: UsageReport, b: UsageReport, what: str) -> None:
    assert [line.key for line in a.lines] == [line.key for line in b.lines], what
    for x, y in zip([*a.lines, a.total], [*b.lines, b.total], strict=True):
        for field in type(x).model_fields:
            if field != "key":
                assert getattr(x, field) == pytest.approx(getattr(y, field), rel=1e-9,
                                                          abs=1e-9), (what, x.key, field)


def test_reports_from_daily_sums_equal_reports_from_the_entries(sim: Sim) -> None:
    rng = random.Random(11)
    jobs = _sim_bookings(sim)
    _booked_over_days(sim, jobs, rng)
    nonzero = 0
    for window in _windows(rng):
        for by in GROUPS:
            for team in (None, "vision", "language"):
                daily = _report(sim, by, window, team, daily=True)
                _same(daily, _report(sim, by, window, team, daily=False), f"{by} {window}")
                nonzero += daily.total.gpu_hours > 0
    assert nonzero > 100
    _series_equal_windows(sim)
    whole = _report(sim, "pool", (None, None), None, daily=True)
    assert {"slurm-h100", "k8s-a100", ""} <= {line.key for line in whole.lines}
    assert whole.total.waste_unsplit > 0 and whole.total.unpriced_gpu_hours > 0
    assert {k for k in ("waste_failed", "waste_lost", "waste_preempted", "waste_cancelled")
            if getattr(whole.total, k) > 0} == {"waste_failed", "waste_lost",
                                                "waste_preempted", "waste_cancelled"}


def _series_equal_windows(sim: Sim) -> None:
    """The dashboard's bars (read_usage_series, one statement) equal one report per bar: bars
    of whole days (from the daily sums) and bars of hours (from the entries)."""
    days = [DAY0 + timedelta(days=d) for d in range(-1, 7)]
    hours = [DAY0 + timedelta(days=1, hours=19 + h * 5) for h in range(10)]  # one midnight
    for bounds in (days, hours, days[2:4], hours[3:5]):
        for by in GROUPS:
            for team in (None, "language"):
                with sim.plane.db.read() as s:
                    bars = hours_series(s, by, bounds, team)
                for rows, a, b in zip(bars, bounds, bounds[1:], strict=False):
                    one = _report(sim, by, (a, b), team, daily=False)
                    _same(usage_report(rows, by, a, b, team), one, f"bar {by} {a} {b}")


def test_whole_days_are_read_from_the_daily_sums(sim: Sim) -> None:
    """Not a second scan of the entries: a row put into ledger_daily shows in reports over
    whole days, and not in those windows' edges or the raw sums."""
    with sim.plane.db.write() as s:
        s.connection().execute(sa.insert(DAILY), [
            {"dim": "team", "day": date(2026, 11, 3), "team": "vision", "value": "vision",
             "kind": "usage", "gpu_hours": 7.0, "cost": 7.0, "unpriced_gpu_hours": 0.0,
             "entries": 1}])
    days = (DAY0, DAY0 + timedelta(days=3))
    assert _report(sim, "team", days, None, daily=True).total.gpu_hours == 7.0
    assert _report(sim, "team", days, None, daily=False).total.gpu_hours == 0.0
    inside = (DAY0 + timedelta(days=1, hours=1), DAY0 + timedelta(days=1, hours=20))
    assert _report(sim, "team", inside, None, daily=True).total.gpu_hours == 0.0
