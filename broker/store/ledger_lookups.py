"""The ledger entries a transaction already read, so that a reconcile chunk looks its attempts'
entries up in one statement instead of three per attempt (broker.ledger's `release` asks for
the reservation and the release, `charge` for the usage entry).

`read_ahead(session, keys)` reads the reserve, release and usage entries of the (job, attempt)
keys at once; until the block ends, broker.ledger answers those look-ups for those keys from
what it read and from what it wrote since (`learn`), so a look-up still sees the entry the
same transaction queued a moment before (broker.store.batch may not have sent it yet). Keys
not read ahead are looked up in the database, as outside the block.

What makes this safe: every path that writes a job's ledger entries holds its job's row lock
and moves the job's `last_seq` in the same transaction (set_state's ledger rules, `charge` of
the reconciler and of the preemption with their transitions, the cancel; on SQLite every writer
holds the database's write lock), but for the reconcile pass of the job's own backend (a
cancelled job's attempt booked, broker.control.reconcile), which is the caller or runs before
or after it. The caller either holds the keys' job rows locked before it reads ahead, or locks
them before its writes are sent and gives up if any moved meanwhile (records.lock_unmoved):
nobody else adds an entry for these keys that it does not see. A savepoint the caller rolls
back takes its entries with it while this block still knows them: the caller must not look that
job's keys up again in the block (a reconcile chunk meets each job once:
broker.control.reconcile_apply).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.in_lists import in_chunks, pair_params, pairs_in
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

KINDS = ("reserve", "release", "usage")  # the kinds broker.ledger looks up before it writes
_KEY = "isthmus_ledger_lookups"
_Known = dict[tuple[str, int], dict[str, Any]]
_ENTRIES_OF = sa.select(ENTRIES).where(
    ENTRIES.c.kind.in_(KINDS),
    pairs_in(ENTRIES.c.job_id, ENTRIES.c.attempt, "keys"),
)
"""Built once (its compiled form reused)."""


@contextlib.contextmanager
def read_ahead(session: Session, keys: list[tuple[str, int]]) -> Iterator[None]:
    """Read the looked-up entries of `keys` (job id, attempt) in one statement per 500 keys
    and answer their look-ups from them in this block (the keys' jobs locked by the caller, or
    locked and checked unmoved before its writes are sent)."""
    if _KEY in session.info:
        raise RuntimeError("ledger read-ahead does not nest")
    known: _Known = {key: {} for key in keys}
    conn = session.connection()
    for chunk in in_chunks(sorted(known)):
        rows = conn.execute(_ENTRIES_OF, pair_params("keys", chunk))
        for row in rows:
            known[(row.job_id, row.attempt)][row.kind] = row
    session.info[_KEY] = known
    try:
        yield
    finally:
        session.info.pop(_KEY, None)


def lookup(session: Session, job_id: str, attempt: int, kind: str) -> tuple[bool, Any]:
    """(True, the entry or None) when the key was read ahead; (False, None): ask the
    database."""
    known: _Known | None = session.info.get(_KEY)
    entries = known.get((job_id, attempt)) if known is not None else None
    if entries is None or kind not in KINDS:
        return False, None
    return True, entries.get(kind)


def learn(session: Session, params: dict[str, Any]) -> None:
    """An entry this transaction wrote (or queued): later look-ups of a read-ahead key see it."""
    known: _Known | None = session.info.get(_KEY)
    entries = known.get((params["job_id"], params["attempt"])) if known is not None else None
    if entries is not None and params["kind"] in KINDS:
        entries[params["kind"]] = SimpleNamespace(**params)

