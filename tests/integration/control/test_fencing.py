"""Fencing on both databases: once another replica holds the lease at a newer epoch, the old
leader's control-loop writes are refused (rolled back) and its runtime steps down; lease expiry
is judged by the database's clock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from broker.control.admission import run_admission
from broker.control.lease import LeaderLease
from broker.control.runtime import Intervals, Runtime
from broker.domain import JobState
from broker.orchestration.submission import submit_job
from broker.store import Database, utcnow
from broker.store import attempts as att
from broker.store.db_clock import db_now
from broker.store.fence import Deposed, FencedDatabase
from broker.store.queries import get_job, job_events
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim
from tests.harness.wait import wait_until


def _cycles(db: Database) -> int:
    with db.read() as s:
        return int(s.connection().execute(
            sa.select(sa.func.count()).select_from(att.CYCLES)).scalar() or 0)


def test_a_deposed_leaders_admission_writes_nothing(sim: Sim) -> None:
    api_db = sim.plane.db
    job = submit_job(api_db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    old, new = LeaderLease(api_db, holder="old", ttl=10), LeaderLease(api_db, holder="new", ttl=10)
    t0 = utcnow()
    assert old.try_acquire(t0)
    sim.plane.fence(old.name)
    sim.plane.epoch = old.epoch
    assert isinstance(sim.plane.db, FencedDatabase)
    assert new.try_acquire(t0 + timedelta(seconds=11)) and new.epoch == old.epoch + 1

    with pytest.raises(Deposed, match="write of epoch 1 refused: the lease is at epoch 2"):
        run_admission(sim.plane)  # the old leader wakes up and carries on its cycle
    with api_db.read() as s:
        row = get_job(s, job.id)
        assert row is not None and row.state == JobState.QUEUED.value
        assert [e.to_state for e in job_events(s, job.id)][-1] == JobState.QUEUED.value
        assert att.attempts_of(s, job.id) == []
    assert _cycles(api_db) == 0 and sim.plane.db.refused >= 1

    sim.plane.epoch = new.epoch  # the same writes under the current epoch land
    assert run_admission(sim.plane).record.admitted == 1
    assert _cycles(api_db) == 1


def test_the_runtime_steps_down_on_a_refused_write(threaded_sim: Sim) -> None:
    sim = threaded_sim
    api_db = sim.plane.db
    fast = Intervals(admission=0.2, dispatch=0.1, reconcile=0.2, lease_ttl=600)
    runtime = Runtime(sim.plane, LeaderLease(api_db, holder="old", ttl=fast.lease_ttl), fast)
    runtime.start()
    try:
        wait_until(lambda: runtime.leading, 60, "the runtime to lead", interval=0.05)
        # another replica takes over (as if the lease had expired while this one was paused)
        far = db_now_utc(api_db) + timedelta(seconds=fast.lease_ttl + 1)
        assert LeaderLease(api_db, holder="new", ttl=fast.lease_ttl).try_acquire(far)
        before = _cycles(api_db)
        wait_until(lambda: not runtime.leading, 60, "the deposed runtime to step down",
                   interval=0.05)
        assert isinstance(sim.plane.db, FencedDatabase) and sim.plane.db.refused >= 1

        def stopped() -> bool:  # every loop job paused, none running: nothing more can write
            paused = all(runtime.scheduler.get_job(j).next_run_time is None
                         for j in runtime._loop_ids)
            return paused and not runtime._running

        wait_until(stopped, 60, "the deposed runtime's loop to stop", interval=0.05)
        assert _cycles(api_db) == before  # the passes it ran since were refused
    finally:
        runtime.stop()


def db_now_utc(db: Database):
    with db.read() as s:
        return db_now(s.connection())


def test_lease_time_is_the_databases_clock(db: Database) -> None:
    now = db_now_utc(db)
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert abs((now - utcnow().astimezone(UTC)).total_seconds()) < 60
    lease = LeaderLease(db, holder="a", ttl=30)
    assert lease.try_acquire()
    _, _, expires = lease.current() or ("", 0, now)
    assert timedelta(seconds=29) < expires - now < timedelta(seconds=60)


def _fenced_write(fenced: FencedDatabase, paused: threading.Event | None = None,
                  go: threading.Event | None = None) -> None:
    """A control-loop write; with `paused`/`go`: held between its fence and its commit."""
    with fenced.write() as s:
        s.connection().execute(sa.select(sa.literal(1)))
        if paused is not None and go is not None:
            def hold(_: Any) -> None:
                paused.set()
                assert go.wait(60)
            sa.event.listen(s, "before_commit", hold)  # after the fence's check


@POSTGRES_ONLY  # SQLite serialises every writer on its write lock
def test_the_leaders_writes_share_the_fence_and_a_take_over_waits_for_them(
    db: Database,
) -> None:
    """Issue 27: the fence locked the lease row FOR UPDATE, so the loop's passes (threads of
    their own) waited for each other's commits at it. It is a share now; a take-over still
    waits for a write that passed the fence, and that write is the old epoch's last."""
    old = LeaderLease(db, holder="old", ttl=10)
    t0 = utcnow()
    assert old.try_acquire(t0)
    fenced = FencedDatabase.over(db, old.name, lambda: old.epoch)
    paused, go = threading.Event(), threading.Event()
    first = threading.Thread(target=_fenced_write, args=(fenced, paused, go))
    first.start()
    out: dict[str, Any] = {}
    new = LeaderLease(db, holder="new", ttl=10)
    take_over = threading.Thread(
        target=lambda: out.update(took=new.try_acquire(t0 + timedelta(seconds=11))))
    try:
        assert paused.wait(60)
        second = threading.Thread(target=_fenced_write, args=(fenced,))
        second.start()
        second.join(20)  # with the row locked FOR UPDATE it waits for `go`: never set
        assert not second.is_alive(), "a write of the leader waited for another's commit"
        take_over.start()
        wait_until(lambda: lock_waiters(db) >= 1, 30, "the take-over waiting")
        assert take_over.is_alive() and "took" not in out
    finally:
        go.set()
        first.join(60)
    take_over.join(60)
    assert out["took"] and new.epoch == old.epoch + 1
    with pytest.raises(Deposed):
        _fenced_write(fenced)


@POSTGRES_ONLY
def test_a_renewal_that_waits_for_the_fenced_writes_keeps_its_whole_term(db: Database) -> None:
    """The renewal locks the lease row, which the fenced writes in flight share: its new
    expiry is counted from the database's clock once the row is its own, not from before the
    wait (which would shorten the term by the wait; found in review)."""
    lease = LeaderLease(db, holder="old", ttl=10)
    assert lease.try_acquire()
    fenced = FencedDatabase.over(db, lease.name, lambda: lease.epoch)
    paused, go = threading.Event(), threading.Event()
    first = threading.Thread(target=_fenced_write, args=(fenced, paused, go))
    first.start()
    out: dict[str, Any] = {}
    renewal = threading.Thread(target=lambda: out.update(renewed=lease.try_acquire()))
    try:
        assert paused.wait(60)
        renewal.start()
        wait_until(lambda: lock_waiters(db) >= 1, 30, "the renewal waiting")
        time.sleep(3)  # the write holds the share this long (the scenario, not a wait)
    finally:
        go.set()
        first.join(60)
    renewal.join(60)
    assert out["renewed"]
    _, _, expires = lease.current() or ("", 0, utcnow())
    left = (expires - db_now_utc(db)).total_seconds()
    assert left > 8, f"the renewed lease has {left:.1f} s of its 10 left"
