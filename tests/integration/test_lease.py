"""Leadership on both databases: exactly one holder; expiry and release hand over."""

from __future__ import annotations

from datetime import timedelta

from broker.control.lease import LeaderLease
from broker.store import Database, utcnow


def test_one_leader_then_handover_on_expiry_with_a_new_epoch(db: Database) -> None:
    a = LeaderLease(db, holder="a", ttl=10)
    b = LeaderLease(db, holder="b", ttl=10)
    t0 = utcnow()
    assert a.try_acquire(t0) is True and a.epoch == 1
    assert b.try_acquire(t0 + timedelta(seconds=1)) is False
    assert a.try_acquire(t0 + timedelta(seconds=5)) is True and a.epoch == 1  # renewal
    assert b.try_acquire(t0 + timedelta(seconds=14)) is False  # renewed at 5, expires at 15
    assert b.try_acquire(t0 + timedelta(seconds=16)) is True and b.epoch == 2
    assert a.try_acquire(t0 + timedelta(seconds=17)) is False
    holder, epoch, _ = b.current() or ("", 0, None)
    assert (holder, epoch) == ("b", 2)


def test_release_hands_over_at_once(db: Database) -> None:
    a = LeaderLease(db, holder="a", ttl=60)
    b = LeaderLease(db, holder="b", ttl=60)
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert b.try_acquire() and b.epoch == 2
