"""GPU-hours used per team and per (team, user) since a day, for the GPU-hour budgets.

Read from the ledger's daily sums (ledger_daily, kind `usage`: every GPU-hour an attempt held,
booked on the day it ended), summed by the database over its primary key's leading columns
(dim, day): one statement per distinct period start (at most three: day, week, month), each
answering one row per team or user, however many days and entries lie behind it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import date

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.tables import LEDGER_DAILY as DAILY

USAGE_KIND = "usage"

Used = dict[tuple[str, str | None], float]
"""GPU-hours per (team, user), user None for the whole team."""


def used_since(s: Session, since: date, teams: Collection[str],
               user_teams: Collection[str]) -> Used:
    """GPU-hours used from `since` (a UTC day) on: per team of `teams`, and per user of each
    team of `user_teams`."""
    which = []
    if teams:
        which.append(sa.and_(DAILY.c.dim == "team", DAILY.c.team.in_(sorted(teams))))
    if user_teams:
        which.append(sa.and_(DAILY.c.dim == "user", DAILY.c.team.in_(sorted(user_teams))))
    if not which:
        return {}
    stmt = (sa.select(DAILY.c.dim, DAILY.c.team, DAILY.c.value, sa.func.sum(DAILY.c.gpu_hours))
            .where(sa.or_(*which), DAILY.c.day >= since, DAILY.c.kind == USAGE_KIND)
            .group_by(DAILY.c.dim, DAILY.c.team, DAILY.c.value))
    return {(team, None if dim == "team" else value): float(hours)
            for dim, team, value, hours in s.connection().execute(stmt)}


def used_in(s: Session, windows: Mapping[date, tuple[Collection[str], Collection[str]]]
            ) -> dict[date, Used]:
    """`used_since` for each period start: (teams, user_teams) per start."""
    return {since: used_since(s, since, teams, users)
            for since, (teams, users) in sorted(windows.items())}
