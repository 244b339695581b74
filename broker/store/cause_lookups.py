"""Cause keys known to be new, so that a reconcile chunk asks whether its transitions' causes
were applied before in one statement instead of one per transition (set_state's idempotency
look-up, broker.store.records.event_for_cause).

`read_ahead(session, pairs)` reads which of the (job id, cause key) pairs have an event, at
once; until the block ends, `records.event_for_cause` answers "none" for a pair that had none
without asking the database. Every other look-up goes to the database as outside the block:
a pair that had an event (the event is read there), a pair not read ahead, and a pair whose
event this transaction wrote since (`learn`).

What makes this safe: the caller holds the pairs' job rows locked before it reads ahead, and
every event is appended under its job's row lock (set_state; on SQLite every writer holds the
database's write lock): nobody else can add an event for these jobs until the caller commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.in_lists import in_chunks, pair_params, pairs_in
from broker.store.tables import EVENTS

_KEY = "isthmus_cause_lookups"
_EVENTS_OF = sa.select(EVENTS.c.job_id, EVENTS.c.cause_key).where(
    pairs_in(EVENTS.c.job_id, EVENTS.c.cause_key, "pairs"))
"""Built once (its compiled form reused); the unique index on (job, cause) answers it."""


@contextlib.contextmanager
def read_ahead(session: Session, pairs: list[tuple[str, str]]) -> Iterator[None]:
    """Find which of `pairs` (job id, cause key) have no event, one statement per 500 pairs,
    and answer their look-ups in this block (the pairs' jobs locked by the caller)."""
    with fresh(session, [], read=pairs):
        yield


def _without_events(session: Session, pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of `pairs` that have no event (one statement per 500 pairs)."""
    new = set(pairs)
    conn = session.connection()
    for chunk in in_chunks(sorted(new)):
        rows = conn.execute(_EVENTS_OF, pair_params("pairs", chunk))
        new.difference_update((r[0], r[1]) for r in rows)
    return new


@contextlib.contextmanager
def fresh(session: Session, pairs: list[tuple[str, str]],
          read: list[tuple[str, str]] | None = None) -> Iterator[None]:
    """`read_ahead` for pairs that cannot have an event, without asking: each key names
    something this transaction created with an id never given before (a reconcile chunk's
    keys, `fact:<id>:<step>`, name the facts it has just inserted; facts are never deleted, so
    no id comes back). Only the look-ups are skipped: set_state still writes each event with
    its key, which the unique index on (job, cause) keeps unique. `read`: more pairs, which
    may have one, read ahead in the same block (as `read_ahead` reads them; the caller holds
    their jobs locked)."""
    if _KEY in session.info:  # checked before reading
        raise RuntimeError("cause read-ahead does not nest")
    new = set(pairs)
    if read:
        new |= _without_events(session, read)
    with _known(session, new):
        yield


@contextlib.contextmanager
def _known(session: Session, new: set[tuple[str, str]]) -> Iterator[None]:
    if _KEY in session.info:
        raise RuntimeError("cause read-ahead does not nest")
    session.info[_KEY] = new
    try:
        yield
    finally:
        session.info.pop(_KEY, None)


def known_new(session: Session, job_id: str, key: str) -> bool:
    """True when the pair was read ahead and has no event: nothing to look up."""
    new: set[tuple[str, str]] | None = session.info.get(_KEY)
    return new is not None and (job_id, key) in new


def learn(session: Session, job_id: str, key: str) -> None:
    """An event of the pair was written (or queued) in this transaction: ask the database."""
    new: set[tuple[str, str]] | None = session.info.get(_KEY)
    if new is not None:
        new.discard((job_id, key))
