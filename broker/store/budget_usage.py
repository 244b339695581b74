"""GPU-hours used per team and per (team, user) per UTC day, for the GPU-hour budgets.

Read from the ledger's daily sums (ledger_daily, kind `usage`: every GPU-hour an attempt held,
booked on the day it ended), one statement over its primary key's leading columns (dim, day):
at most a month of days per team and user, however many entries the ledger holds.
"""

from __future__ import annotations

from datetime import date

import sqlalchemy as sa
from sqlmodel import Session

from broker.store.ledger_tables import DAILY

USAGE_KIND = "usage"

Daily = dict[tuple[str, str | None], dict[date, float]]
"""GPU-hours per (team, user or None for the whole team), per day."""


def used_per_day(s: Session, since: date, teams: list[str] | None = None) -> Daily:
    """GPU-hours used from `since` (a UTC day) on, per team and per (team, user) and day;
    `teams`: only those."""
    stmt = (sa.select(DAILY.c.dim, DAILY.c.team, DAILY.c.value, DAILY.c.day, DAILY.c.gpu_hours)
            .where(DAILY.c.dim.in_(("team", "user")), DAILY.c.day >= since,
                   DAILY.c.kind == USAGE_KIND))
    if teams is not None:
        stmt = stmt.where(DAILY.c.team.in_(sorted(teams)))
    out: Daily = {}
    for dim, team, value, day, hours in s.connection().execute(stmt):
        key = (team, None) if dim == "team" else (team, value)
        per_day = out.setdefault(key, {})
        d = day if isinstance(day, date) else date.fromisoformat(str(day))
        per_day[d] = per_day.get(d, 0.0) + float(hours)
    return out

