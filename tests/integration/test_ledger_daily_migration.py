"""Revision 0011 sums the ledger entries booked before it into ledger_daily (entries without a
pool or user under their attempt's pool and job's submitter), and the trigger adds the ones
booked after it: reports from the daily sums equal reports from the entries, on SQLite and
PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from broker.store import migrate
from broker.store.attempts import ATTEMPTS
from broker.store.db import connect
from broker.store.records import JOBS
from broker.store.reports import GROUPS, hours_by
from broker.store.tables import LEDGER_DAILY as DAILY
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from broker.views.usage import UsageReport, usage_report

T0 = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)


def _job(i: int) -> dict[str, object]:
    return {"id": f"J{i:015d}", "name": "j", "team": ("vision", "language")[i % 2],
            "queue": "default", "priority": "normal", "state": "SUCCEEDED",
            "reason": "Succeeded", "message": "", "attempt": 1, "last_seq": 1,
            "total_gpus": 8, "spec_json": "{}", "spec_hash": "x" * 64,
            "submitted_by": f"user{i % 3}", "created_at": T0, "updated_at": T0,
            "exclude_json": "{}"}


def _attempt(i: int) -> dict[str, object]:
    return {"job_id": f"J{i:015d}", "number": 1, "snapshot_json": "{}", "spec_hash": "x" * 64,
            "backend_name": f"isthmus-{i}", "created_at": T0, "ended_at": T0,
            "backend": "sim", "pool": f"pool-{i % 4}", "flavor": "h100-80g", "gpus": 8,
            "dispatch": "created", "phase": "SUCCEEDED", "preempted": False}


def _entries(first: int, n: int) -> list[dict[str, object]]:
    """Usage, waste and reservations of jobs first..first+n, one every 3 hours; every third
    written as before revision 0010 (no pool, no user) and 0007 (no cost)."""
    rows = []
    for i in range(first, first + n):
        legacy = i % 3 == 0
        at = T0 + timedelta(hours=3 * i, minutes=i)
        for kind, hours in (("reserve", 0.0), ("usage", 1.0 + i), ("waste:failed", 0.5 * i)):
            hour_kind = kind != "reserve"
            rows.append({
                "job_id": f"J{i:015d}", "attempt": 1, "kind": kind,
                "team": ("vision", "language")[i % 2], "flavor": "h100-80g", "gpus": 8,
                "borrowed_gpus": 0, "gpu_hours": hours, "at": at, "note": "",
                "cost": None if legacy or not hour_kind else 2 * hours,
                "pool": None if legacy or not hour_kind else f"pool-{i % 4}",
                "submitted_by": None if legacy or not hour_kind else f"user{i % 3}"})
    return rows


def test_revision_0011_sums_earlier_entries_and_the_trigger_later_ones(empty_url: str) -> None:
    db = connect(empty_url)
    try:
        migrate.upgrade(db, "0010")
        with db.write() as s:
            conn = s.connection()
            conn.execute(sa.insert(JOBS), [_job(i) for i in range(40)])
            conn.execute(sa.insert(ATTEMPTS), [_attempt(i) for i in range(40)])
            conn.execute(sa.insert(ENTRIES), _entries(0, 20))
        migrate.upgrade(db, "0012")  # the trigger's last revision
        with db.read() as s:
            backfilled = s.connection().execute(sa.select(sa.func.count()).select_from(
                DAILY)).scalar_one()
        assert backfilled > 0
        with db.write() as s:
            s.connection().execute(sa.insert(ENTRIES), _entries(20, 20))
        migrate.upgrade(db)  # revision 0013 drops the trigger and keeps its sums
        windows = [(None, None), (T0 + timedelta(hours=2), T0 + timedelta(days=3, hours=5)),
                   (T0 + timedelta(hours=26), T0 + timedelta(days=4))]
        for by in GROUPS:
            for window in windows:
                with db.read() as s:
                    daily = usage_report(hours_by(s, by, *window), by, *window)
                    raw = usage_report(hours_by(s, by, *window, daily=False), by, *window)
                _same(daily, raw)
                assert "" not in {line.key for line in daily.lines}
                assert daily.total.gpu_hours > 0 and daily.total.unpriced_gpu_hours > 0
    finally:
        db.dispose()


def _same(a: UsageReport, b: UsageReport) -> None:
    assert [x.key for x in a.lines] == [x.key for x in b.lines]
    for x, y in zip([*a.lines, a.total], [*b.lines, b.total], strict=True):
        assert x.model_dump(exclude={"key"}) == pytest.approx(y.model_dump(exclude={"key"}),
                                                              rel=1e-9), (a.by, x.key)
