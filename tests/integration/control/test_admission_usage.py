"""The admission cycle's fair-share history (broker.control.admission_usage) equals what the
ledger gives read whole (plane.decayed_from_ledger), while reading only the open reservations
and those released since the previous cycle (less a window for late commits)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker import ledger
from broker.control import admission_usage
from broker.control.plane import decayed_from_ledger
from broker.domain import JobState
from broker.store import open_database
from tests.builders import insert_job_in_state
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.sim import Sim


def _reserve(sim: Sim, team: str, gpus: int, at: datetime) -> str:
    with sim.plane.db.write() as s:
        job = insert_job_in_state(s, JobState.RUNNING)
        ledger.reserve(s, ledger.Reservation(job, 1, team, "h100-80g", gpus), at)
    return job


def _release(sim: Sim, job: str, at: datetime) -> None:
    with sim.plane.db.write() as s:
        assert ledger.release(s, job, 1, at)


def _rows_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by the number of ledger rows each cycle's read returns."""
    read: list[int] = []
    original = admission_usage._rows

    def counted(s: Any, released_from: float, after_id: int | None = None,
                reserved_after: int | None = None, skip: Any = (),
                window: bool = True) -> list[Any]:
        rows = list(original(s, released_from, after_id, reserved_after, skip, window))
        read.append(len(rows))
        return rows

    monkeypatch.setattr(admission_usage, "_rows", counted)
    return read


def _both(sim: Sim, now: datetime) -> tuple[dict[Any, float], dict[Any, float]]:
    half = sim.plane.params.fair_share_half_life_s
    with sim.plane.db.read() as s:
        kept = admission_usage.decayed_usage(sim.plane, s, now, {})
        whole = decayed_from_ledger(s, now, half)
    return kept, whole


def test_the_kept_history_equals_the_ledger_read_whole(sim: Sim) -> None:
    t0 = sim.clock.now
    half = sim.plane.params.fair_share_half_life_s
    old = _reserve(sim, "vision", 32, t0 - timedelta(seconds=2 * half))
    _release(sim, old, t0 - timedelta(seconds=half))
    held = _reserve(sim, "language", 16, t0 - timedelta(seconds=half))
    now = t0
    for step in range(6):
        kept, whole = _both(sim, now)
        assert kept == pytest.approx(whole, rel=1e-9, abs=1e-9), step
        if step == 1:
            _release(sim, held, now)
        if step == 2:  # released late: stamped 60 s before the previous cycle, written now
            late = _reserve(sim, "speech", 8, now - timedelta(seconds=600))
            kept, whole = _both(sim, now)
            _release(sim, late, now - timedelta(seconds=60))
        now += timedelta(seconds=30 + 200 * step)
    assert kept[("vision", "h100-80g")] > 0 and kept[("speech", "h100-80g")] > 0


def test_a_cycle_reads_only_new_and_recently_released_reservations(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = sim.clock.now
    for i in range(20):
        job = _reserve(sim, "vision", 4, t0 - timedelta(seconds=7200 + i))
        _release(sim, job, t0 - timedelta(seconds=3600 + i))
    _reserve(sim, "language", 8, t0 - timedelta(seconds=60))  # still held
    read = _rows_read(monkeypatch)
    first, _ = _both(sim, t0)
    later, whole = _both(sim, t0 + timedelta(seconds=5))
    speech = _reserve(sim, "speech", 2, t0 + timedelta(seconds=6))
    newest, whole_now = _both(sim, t0 + timedelta(seconds=10))
    _release(sim, speech, t0 + timedelta(seconds=12))
    ended, whole_ended = _both(sim, t0 + timedelta(seconds=15))
    again, whole_again = _both(sim, t0 + timedelta(seconds=20))
    # the whole history once; then nothing new (the open reservation is kept); then the new
    # one; its release; then nothing: a release summed already is not read again while it is
    # within the window for late commits
    assert read == [21, 0, 1, 1, 0]
    assert newest == pytest.approx(whole_now, rel=1e-9)
    assert later == pytest.approx(whole, rel=1e-9)
    assert ended == pytest.approx(whole_ended, rel=1e-9)
    assert again == pytest.approx(whole_again, rel=1e-9)
    assert later[("vision", "h100-80g")] < first[("vision", "h100-80g")]


def test_no_release_summed_within_the_window_is_read_again(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However many releases the window for late commits holds (the soak's 100 a second make
    12,000), a cycle reads none it summed already (a bound of 1,000 left out of the read
    re-read the rest every cycle: a sixth of the soak's leader); once out of the window they
    are forgotten."""
    t0 = sim.clock.now
    with sim.plane.db.write() as s:
        for _ in range(1100):
            job = insert_job_in_state(s, JobState.RUNNING)
            ledger.reserve(s, ledger.Reservation(job, 1, "vision", "h100-80g", 1),
                           t0 - timedelta(seconds=100))
            assert ledger.release(s, job, 1, t0 - timedelta(seconds=30))
    read = _rows_read(monkeypatch)
    _both(sim, t0)
    kept, whole = _both(sim, t0 + timedelta(seconds=5))
    assert read == [1100, 0]
    assert kept == pytest.approx(whole, rel=1e-9)
    history = sim.plane.soft.usage_history
    assert isinstance(history, admission_usage.History) and len(history.counted) == 1100
    _both(sim, t0 + timedelta(seconds=admission_usage.WINDOW_S))
    assert len(history.counted) == 0 and not history.expiry


def test_a_release_written_long_after_its_timestamp_is_counted(sim: Sim) -> None:
    """A reconciler pass stamps its releases with the time it started (before its backend's
    observe call and all its chunks): one written more than the window after that stamp is
    still found (by its entry's id), not dropped from the history until the next full read."""
    t0 = sim.clock.now
    job = _reserve(sim, "vision", 32, t0 - timedelta(seconds=3600))
    _both(sim, t0)
    _both(sim, t0 + timedelta(seconds=300))
    _release(sim, job, t0)  # stamped at the pass's start, written 300 s later
    kept, whole = _both(sim, t0 + timedelta(seconds=310))
    assert kept == pytest.approx(whole, rel=1e-9, abs=1e-9)
    assert kept[("vision", "h100-80g")] > 0


@POSTGRES_ONLY  # entry ids are taken at insert: a lower one may commit after a higher one
def test_a_release_committed_after_a_newer_one_was_read_waits_for_the_next_window_read(
    sim: Sim,
) -> None:
    """Between two reads of the window (REREAD_S) a cycle reads the releases newer than the
    last one it read, by entry id, without sending the window's summed releases: a release
    whose transaction was open while a newer one was read counts as held until the next
    read of the window, which sums its exact share."""
    t0 = sim.clock.now
    late = _reserve(sim, "vision", 8, t0 - timedelta(seconds=3600))
    other = _reserve(sim, "language", 8, t0 - timedelta(seconds=3600))
    _both(sim, t0)  # the history built, the window read
    inserted, commit = threading.Event(), threading.Event()

    def release_slowly() -> None:
        with sim.plane.db.write() as s:
            assert ledger.release(s, late, 1, t0)
            inserted.set()
            commit.wait(30)

    writer = threading.Thread(target=release_slowly)
    writer.start()
    try:
        assert inserted.wait(30)
        _release(sim, other, t0 + timedelta(seconds=1))  # a newer entry id, committed first
        kept, whole = _both(sim, t0 + timedelta(seconds=2))
        assert kept == pytest.approx(whole, rel=1e-9)
    finally:
        commit.set()
        writer.join(30)
    vision = ("vision", "h100-80g")
    kept, whole = _both(sim, t0 + timedelta(seconds=admission_usage.REREAD_S - 1))
    # still held in the history (8 GPUs for seconds more), released in the ledger
    assert kept[vision] > whole[vision] and kept[vision] != pytest.approx(whole[vision], rel=1e-9)
    kept, whole = _both(sim, t0 + timedelta(seconds=admission_usage.REREAD_S + 1))
    assert kept == pytest.approx(whole, rel=1e-9)


def test_a_short_half_life_never_overflows_the_kept_sums(sim: Sim) -> None:
    """The closed sums grow as 2^(age of the origin / half-life): with a half-life of a second
    (the configuration allows any positive one) they left a float's range within FULL_EVERY_S,
    and every admission cycle failed until the next full read."""
    sim.plane.params.fair_share_half_life_s = 1.0
    t0 = sim.clock.now
    job = _reserve(sim, "vision", 8, t0 - timedelta(seconds=5))
    _both(sim, t0)
    _release(sim, job, t0 + timedelta(seconds=1100))
    for later in (1101, 1102, 1500):
        kept, whole = _both(sim, t0 + timedelta(seconds=later))
        for key in kept.keys() | whole.keys():  # past the horizon: in one, ~0, not the other
            assert kept.get(key, 0.0) == pytest.approx(whole.get(key, 0.0), rel=1e-9, abs=1e-9)


def test_on_sqlite_the_cycles_read_walks_only_entries_past_what_it_read(
        tmp_path: Path) -> None:
    """On SQLite (no planner statistics) each part of the cycle's read is driven by a range
    of the ledger's key past what the history read before: the new reservations, the new
    releases (each joined to its reservation by the unique key). The releases' part was
    driven by the reservations up to the last one read, the whole ledger: a walk that grew
    with every job the installation ever ran, each cycle."""
    db = open_database(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        with db.read() as s:
            conn = s.connection()
            sql = str(admission_usage._since(True, True).compile(dialect=conn.dialect))
            driver = conn.connection.driver_connection
            assert driver is not None
            plan = [row[3] for row in driver.execute(
                "EXPLAIN QUERY PLAN " + sql, [1] * sql.count("?"))]
    finally:
        db.dispose()
    searches = [p for p in plan if p.startswith(("SEARCH", "SCAN"))]
    assert searches == [
        "SEARCH ledger_entries USING INTEGER PRIMARY KEY (rowid>?)",
        "SEARCH rel USING INDEX sqlite_autoindex_ledger_entries_1 "
        "(job_id=? AND attempt=? AND kind=?) LEFT-JOIN",
        "SEARCH rel USING INTEGER PRIMARY KEY (rowid>?)",
        "SEARCH ledger_entries USING INDEX sqlite_autoindex_ledger_entries_1 "
        "(job_id=? AND attempt=? AND kind=?)",
    ], plan


@POSTGRES_ONLY
def test_on_postgresql_the_window_read_of_the_releases_searches_by_time(sim: Sim) -> None:
    """The window read (by time, REREAD_S) finds the recent releases through the ledger's
    (kind, at) index (revision 0021), or-ed with the primary key's range for the ids, once the
    history is longer than the window: it scanned the whole ledger, a read that grew with
    every job the installation ran."""
    t0 = sim.clock.now
    with sim.plane.db.write() as s:
        for _ in range(400):  # an old history: a day of releases, then three recent ones
            job = insert_job_in_state(s, JobState.RUNNING)
            ledger.reserve(s, ledger.Reservation(job, 1, "vision", "h100-80g", 8),
                           t0 - timedelta(days=2))
            ledger.release(s, job, 1, t0 - timedelta(days=1))
    for i in range(3):
        _release(sim, _reserve(sim, "vision", 8, t0 - timedelta(seconds=3600)),
                 t0 - timedelta(seconds=60 * i))
    with sim.plane.db.write() as s:
        conn = s.connection()
        conn.exec_driver_sql("ANALYZE ledger_entries")
        sql = admission_usage._since(False, True).params(
            since=t0 - timedelta(seconds=300), after=10_000, reserved_after=10_000,
            counted=[1]).compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        plan = " / ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
    assert "Seq Scan" not in plan, plan
    assert "Bitmap Index Scan on ix_ledger_kind_at" in plan, plan
    assert "(at >= " in plan.split("ix_ledger_kind_at", 1)[1].split(" / ", 2)[1], plan
