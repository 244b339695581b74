"""The per-(team, flavor) `quota_usage` counters, written once per transaction at its commit.

Every reservation and release changes a counter row shared by all the jobs of a team and
flavor. Written where it happens, a transaction holds that row's lock from the middle of its
work to its commit, and two transactions take the rows in their own orders: on PostgreSQL a
reconcile chunk (job A's release, then job B's lock) and a cancel of B (B's lock, then A's
counter) deadlocked, and so did the batched admission with either. Here a change is only
noted (`add`); the session's commit applies the sum per counter, last, in key order, so
every transaction takes the counter locks at its very end and in one order, after all its
job rows.

What a rolled-back savepoint noted is dropped with it (a reconcile chunk undoes one attempt
alone); a rolled-back transaction drops everything. `pending` is what this transaction will
add, for a reader of the counters inside the transaction (broker.ledger.usage).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from broker.store import batch, commit_notes
from broker.store.tables import QUOTA_USAGE

USAGE = QUOTA_USAGE  # the live reservations per (team, flavor)

_KEY = "isthmus_quota_deltas"
Key = tuple[str, str]

# One text statement for both databases (SQLite >= 3.24 and PostgreSQL share this syntax): the
# dialects' on_conflict_do_update constructs have no cache key, so SQLAlchemy compiled them again
# on every call, a fifth of the time of admitting a job.
assert USAGE.name == "quota_usage"
UPSERT = sa.text(
    "INSERT INTO quota_usage (team, flavor, reserved_gpus, borrowed_gpus) "
    "VALUES (:t, :f, :g, :b) ON CONFLICT (team, flavor) DO UPDATE SET "
    "reserved_gpus = quota_usage.reserved_gpus + excluded.reserved_gpus, "
    "borrowed_gpus = quota_usage.borrowed_gpus + excluded.borrowed_gpus"
)
# A net decrease: the row exists (SQLite checks CHECKs on an upsert's would-be insert).
_DECREASE = (
    sa.update(USAGE)
    .where(USAGE.c.team == sa.bindparam("t"), USAGE.c.flavor == sa.bindparam("f"))
    .values(reserved_gpus=USAGE.c.reserved_gpus + sa.bindparam("g"),
            borrowed_gpus=USAGE.c.borrowed_gpus + sa.bindparam("b"))
)


def add(session: Session, team: str, flavor: str, gpus: int, borrowed: int) -> None:
    """Note a change of the (team, flavor) counter (negative: a release), applied at commit."""
    commit_notes.note(session, _KEY, ((team, flavor), gpus, borrowed))


def add_many(session: Session, many: list[dict[str, Any]]) -> None:
    """`add` for the summed parameter sets of a batch (broker.store.batch.additive)."""
    for p in many:
        add(session, p["t"], p["f"], p["g"], p["b"])


def pending(session: Session) -> dict[Key, tuple[int, int]]:
    """The (reserved, borrowed) this transaction has noted per counter and not yet applied."""
    return _summed(commit_notes.noted(session, _KEY))


def _summed(items: list[tuple[Any, ...]]) -> dict[Key, tuple[int, int]]:
    sums: dict[Key, tuple[int, int]] = {}
    for key, g, b in items:
        g0, b0 = sums.get(key, (0, 0))
        sums[key] = (g0 + g, b0 + b)
    return sums


def apply(session: Session) -> None:
    """Write the noted changes: one statement per counter, in key order (called by commit)."""
    sums = _summed(commit_notes.take(session, _KEY))
    runs: list[tuple[Any, list[dict[str, Any]]]] = []  # same-statement runs, in key order
    for (team, flavor), (g, b) in sorted(sums.items()):
        if (g, b) == (0, 0):
            continue
        stmt = UPSERT if g >= 0 and b >= 0 else _DECREASE
        if not runs or runs[-1][0] is not stmt:
            runs.append((stmt, []))
        runs[-1][1].append({"t": team, "f": flavor, "g": g, "b": b})
    conn = session.connection()
    for stmt, many in runs:  # executemany sends its rows in order
        batch.execute_many(conn, stmt, many)


commit_notes.register(_KEY, lambda session: apply(session))  # looked up when called
