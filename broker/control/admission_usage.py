"""The fair-share history of the admission cycle, kept up to date instead of re-read whole.

`decayed_from_ledger` (plane.py) reads every reservation of the last HISTORY_HALF_LIVES
half-lives on each call: at 200 submits/s that is every job of the last 20 hours, each cycle
(measured under the soak: the per-cycle read grew with the run's history). The decayed
average is a sum over reservations, and a closed reservation's share only shrinks by one
factor for all of them as time passes:

    g x (2^-(now-end)/h - 2^-(now-start)/h) = 2^-(now-T0)/h x g x (2^(end-T0)/h - 2^(start-T0)/h)

so the leader keeps, per (team, flavor), the sum of the closed reservations' terms relative to
an origin T0, and the open reservations themselves; each cycle reads only the reservations
made since its previous cycle (by entry id) and those released since (less WINDOW_S, for a
release committed late or stamped by another replica's clock), and any release entry newer
than the last one read, whatever its timestamp (a reconciler pass stamps its releases with the
time it started, before its backend's observe call and its chunks): what it counted is
remembered by (job, attempt) until the window has passed it. On SQLite, whose one writer at a
time takes entry ids in commit order, the releases newer than the last one read are all a
cycle has not read, so it reads those alone.

Soft state on the plane (whose own fields belong to plane.py): a new process, a changed
half-life, a clock that went back, FULL_EVERY_S of use or MAX_EXPONENT start again from the
whole history (a replica leading again keeps it: released reservations never change, and what
was released meanwhile is read as above). On PostgreSQL entry ids are taken at insert, not at
commit, so the window is read again, at most every REREAD_S (the cycles between read by id
alone, as on SQLite): a release whose transaction stayed open across a read of a newer one is
counted from the next read of the window; one whose timestamp is more than WINDOW_S older than
that read is missed until the next full read (its reservation drops out instead of decaying; a
share of the fair-share weight, never a quota or the ledger); likewise a reservation whose
transaction commits after a cycle read a newer one counts only from its release (or the next
full read) on.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.control.plane import HISTORY_HALF_LIVES, ControlPlane, decayed_from_ledger
from broker.store.in_lists import none_of

WINDOW_S = 120.0
"""Releases stamped this long before the previous read of the window are read again (late
commits, skew)."""
REREAD_S = 10.0
"""PostgreSQL: the window is read again at most this often; the cycles between read the
releases newer than the last one read (by entry id). Each read of the window names the
releases it summed already (12,000 at 100 releases a second), an array the driver encoded
and the server matched against the window's rows on every admission cycle: 6% of the soak's
leader. A release committed after a newer one was read is counted up to this late (its
reservation counted as held meanwhile, then its exact share)."""
FULL_EVERY_S = 1800.0
"""The whole history is read again this often (bounds what a missed late release costs)."""

MAX_EXPONENT = 600.0
"""The history also starts again once rate x (now - origin) passes this: its closed terms grow
as e^(rate x age of the origin) and must stay within a float's range (e^709)."""

Key = tuple[str, str]


@dataclass
class History:
    origin: float
    """T0, epoch seconds: the closed sums are relative to it."""
    rate: float
    """ln 2 / half-life, per second."""
    read_since: float
    """Epoch seconds of the last cycle: a clock that goes back behind it starts again."""
    window_at: float
    """Epoch seconds of the last read of the window by time (`REREAD_S`; on SQLite, whose
    reads are all by id, it only bounds what `counted` keeps): the next one reads the
    releases stamped from WINDOW_S before it. At first the horizon plus WINDOW_S, so that
    the history is built from the horizon on."""
    closed: dict[Key, float] = field(default_factory=dict)
    counted: dict[tuple[str, int], tuple[float, int]] = field(default_factory=dict)
    """Closed reservations already summed -> their release time and release entry id (dropped
    once out of window)."""
    expiry: list[tuple[float, tuple[str, int]]] = field(default_factory=list)
    """A heap of `counted`'s release times and keys: what leaves the window is found without
    going over the others (at 100 releases a second the window holds 12,000)."""
    last_release: int | None = None
    """The highest ledger entry id when the history was built, then the highest release id
    read: newer releases are read whatever their timestamp."""
    open: dict[tuple[str, int], tuple[Key, int, float]] | None = None
    """The open reservations, (job, attempt) -> ((team, flavor), GPUs, start): read whole when
    the history is built, then kept from the reservations newer than `last_reserve` and the
    releases read (None: not read yet)."""
    last_reserve: int = 0
    """The highest reservation entry id read."""


def _history(plane: ControlPlane, now: float, rate: float) -> History:
    h = plane.soft.usage_history
    if (not isinstance(h, History) or h.rate != rate or now < h.read_since
            or now - h.origin > FULL_EVERY_S or rate * (now - h.origin) > MAX_EXPONENT):
        horizon = now - HISTORY_HALF_LIVES * math.log(2) / rate
        h = History(origin=now, rate=rate, read_since=horizon + WINDOW_S,
                    window_at=horizon + WINDOW_S)
        plane.soft.usage_history = h
    return h


def _last_id(s: Session) -> int:
    from broker.store.tables import LEDGER_ENTRIES as LEDGER

    return int(s.connection().execute(sa.select(sa.func.max(LEDGER.c.id))).scalar() or 0)


def _rows(s: Session, released_from: float, after_id: int | None = None,
          reserved_after: int | None = None,
          counted: Iterable[int] = (), window: bool = True) -> sa.Result[tuple[object, ...]]:
    """Reservations released at or after `released_from`, or whose release entry is newer
    than `after_id` (a release written long after its own timestamp), but for the release
    entries `counted` (already summed); and either every one still open (`reserved_after`
    None: the history is built) or only those whose reservation entry is newer than
    `reserved_after` (the open ones are kept in memory). `window` False: the releases newer
    than `after_id` alone (`REREAD_S`)."""
    since = datetime.fromtimestamp(released_from, UTC)
    if reserved_after is None:  # the whole history: every reservation open or released since
        return s.connection().execute(_whole(after_id is not None),
                                      {"since": since, "after": after_id})
    # one writer at a time (SQLite's BEGIN IMMEDIATE) takes entry ids in commit order: a
    # release not newer than the last one read committed before that read, which read it
    by_id = after_id is not None and (not window or s.connection().dialect.name == "sqlite")
    # what was summed already would only be skipped: not read again (every one of them, bound
    # as one array: at 100 releases a second, reading the window's 12,000 again each cycle
    # was a sixth of the soak's leader); the read by id never meets it
    skip = [] if by_id else list(counted)
    return s.connection().execute(_since(by_id, after_id is not None), {
        "since": since, "after": after_id, "reserved_after": reserved_after, "counted": skip})


def _parts() -> tuple[sa.Table, sa.FromClause, tuple[sa.ColumnElement[Any], ...],
                      sa.ColumnElement[bool], str, str]:
    from broker.ledger import LedgerKind
    from broker.store.tables import LEDGER_ENTRIES as LEDGER

    rel = LEDGER.alias("rel")
    cols = (LEDGER.c.team, LEDGER.c.flavor, LEDGER.c.gpus, LEDGER.c.job_id, LEDGER.c.attempt,
            LEDGER.c.at, rel.c.at, rel.c.id, LEDGER.c.id)
    pair = sa.and_(rel.c.job_id == LEDGER.c.job_id, rel.c.attempt == LEDGER.c.attempt,
                   rel.c.kind == LedgerKind.RELEASE.value)
    return LEDGER, rel, cols, pair, LedgerKind.RESERVE.value, LedgerKind.RELEASE.value


# The statements are built once, their values bound at each call: building and keying a
# statement of this size cost SQLAlchemy several times what running it costs SQLite.

@functools.cache
def _whole(after: bool) -> sa.Select[tuple[object, ...]]:
    ledger, rel, cols, pair, reserve, _ = _parts()
    released = rel.c.at >= sa.bindparam("since")
    if after:
        released = sa.or_(released, rel.c.id > sa.bindparam("after"))
    return (sa.select(*cols).select_from(ledger.outerjoin(rel, pair))
            .where(ledger.c.kind == reserve, sa.or_(rel.c.at.is_(None), released)))


@functools.cache
def _since(by_id: bool, after: bool) -> sa.CompoundSelect[tuple[object, ...]]:
    """Two narrow reads in one statement: the reservations made since (by id, with their
    release if any) and the releases since with their reservations (not every reservation
    joined to its release each cycle: a read that grew with the history). By id alone the
    releases are a range of the primary key; by time, a scan of the ledger."""
    ledger, rel, cols, pair, reserve, release = _parts()
    new = (sa.select(*cols).select_from(ledger.outerjoin(rel, pair))
           .where(ledger.c.kind == reserve, ledger.c.id > sa.bindparam("reserved_after")))
    released: sa.ColumnElement[bool]
    if by_id:
        released = rel.c.id > sa.bindparam("after")
    else:
        released = rel.c.at >= sa.bindparam("since")
        if after:
            released = sa.or_(released, rel.c.id > sa.bindparam("after"))
        released = sa.and_(released, none_of(rel.c.id, "counted"))
    # by id (SQLite) the releases since are a short range of the key and drive the join; the
    # reservations' bound is kept from the index (`+ 0`), else SQLite's planner (no
    # statistics) walked every reservation up to it, the whole ledger, each cycle
    older = (ledger.c.id + 0) if by_id else ledger.c.id
    ended = (sa.select(*cols).select_from(rel.join(ledger, sa.and_(
                 pair, ledger.c.kind == reserve)))
             .where(rel.c.kind == release, released,
                    older <= sa.bindparam("reserved_after")))
    return sa.union_all(new, ended)


def decayed_usage(plane: ControlPlane, s: Session, now: datetime,
                  in_use: Mapping[Key, int]) -> dict[Key, float]:
    """What `ControlPlane.decayed_usage` returns (the same formula and clamps), reading only
    what changed since the previous call on this plane. For the real admission cycle only
    (a what-if keeps reading the ledger whole: it must not move this state)."""
    half_life = plane.params.fair_share_half_life_s
    if half_life <= 0:
        out = decayed_from_ledger(s, now, half_life)
    else:
        out = _update(_history(plane, now.timestamp(), math.log(2) / half_life), s,
                      now.timestamp())
    for key in in_use:
        out.setdefault(key, 0.0)
    return out


def _forget_counted(h: History, before: float) -> None:
    """Drop the summed releases stamped before `before` (out of the window: never read again)."""
    while h.expiry and h.expiry[0][0] < before:
        at, key = heapq.heappop(h.expiry)
        kept = h.counted.get(key)
        if kept is not None and kept[0] == at:
            del h.counted[key]


def _update(h: History, s: Session, t_now: float) -> dict[Key, float]:
    exp, rate, origin = math.exp, h.rate, h.origin
    if h.last_release is None:  # a new history: what is newer than the ledger now is new
        h.last_release = _last_id(s)
    building = h.open is None
    # the window from the previous read of it: a release the reads by id since then missed
    # was stamped at most WINDOW_S before one of them
    released_from = h.window_at - WINDOW_S
    window = building or t_now - h.window_at >= REREAD_S
    if window:
        h.window_at = t_now
    open_ = h.open = {} if h.open is None else h.open
    rows = _rows(s, released_from, h.last_release, None if building else h.last_reserve,
                 (i for _, i in h.counted.values()), window)
    for team, flavor, gpus, job_id, attempt, start, end, rel_id, res_id in rows:
        key = (team, flavor)
        h.last_reserve = max(h.last_reserve, res_id)
        if rel_id is not None and rel_id > h.last_release:
            h.last_release = rel_id
        if end is None:  # held until now
            open_[(job_id, attempt)] = (key, gpus, start.timestamp())
            continue
        open_.pop((job_id, attempt), None)
        if (job_id, attempt) not in h.counted:
            t_end = min(end.timestamp(), t_now)
            t_start = min(start.timestamp(), t_end)
            h.closed[key] = h.closed.get(key, 0.0) + gpus * (
                exp(rate * (t_end - origin)) - exp(rate * (t_start - origin)))
            h.counted[(job_id, attempt)] = (end.timestamp(), rel_id)
            heapq.heappush(h.expiry, (end.timestamp(), (job_id, attempt)))
    _forget_counted(h, h.window_at - WINDOW_S)  # the next read of the window starts there
    h.read_since = t_now
    scale = exp(-rate * (t_now - origin))
    out = {key: total * scale for key, total in h.closed.items()}
    for key, gpus, start_ts in open_.values():
        t_start = min(start_ts, t_now)
        out[key] = out.get(key, 0.0) + gpus * (1.0 - exp(-rate * (t_now - t_start)))
    return out
