"""GPU-hour budget view: each budget in its current period against the hours used.

A team line per `teams[].budgets` entry (shown with no use too); a user line per
`teams[].user_budgets` entry and user with hours booked in the period. Periods and use are
what admission sees (broker.control.budgets): the ledger's daily sums, periods by the
database's clock. `state`: `ok`, `warning` (a `warn_at` fraction reached) or `spent` (its
`enforce` applies until `renews_at`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Literal

import sqlalchemy as sa
from pydantic import BaseModel

from broker.config import IsthmusConfig
from broker.policy_inputs import budget_periods, budget_windows, budgets
from broker.store import budget_usage
from broker.store.db import Database
from broker.store.db_clock import db_now
from policies.budgets import crossed


class BudgetView(BaseModel):
    team: str
    user: str | None
    """None: the whole team's budget."""
    period: Literal["day", "week", "month"]
    budget: str
    """Where isthmus.yaml sets it: teams[TEAM].budgets[PERIOD] or .user_budgets[PERIOD]."""
    gpu_hours: float
    used_gpu_hours: float
    fraction: float
    warn_at: list[float]
    reached: list[float]
    """The warning fractions (and 1.0) reached in this period."""
    state: Literal["ok", "warning", "spent"]
    enforce: Literal["stop", "lowest"]
    period_start: datetime
    renews_at: datetime


def budget_views(config: IsthmusConfig,
                 used: Mapping[date, Mapping[tuple[str, str | None], float]],
                 now: datetime, team: str | None = None) -> list[BudgetView]:
    """Every budget's line (pure); `team`: that team's only."""
    out: list[BudgetView] = []
    for name, bs in sorted(budgets(config, used, now).by_team.items()):
        if team is not None and name != team:
            continue
        for b in sorted(bs, key=lambda b: (b.user is not None, b.user or "", b.period)):
            marks = crossed(b)
            out.append(BudgetView(
                team=b.team, user=b.user, period=b.period, budget=b.field,
                gpu_hours=b.gpu_hours, used_gpu_hours=round(b.used, 6),
                fraction=round(b.fraction, 6), warn_at=list(b.warn_at), reached=list(marks),
                state="spent" if b.spent else "warning" if marks else "ok",
                enforce=b.enforce, period_start=b.start, renews_at=b.renews))
    return out


PeriodClock = Callable[[sa.Connection], datetime]


def read_budgets(config: IsthmusConfig, db: Database, team: str | None = None,
                 clock: PeriodClock = db_now) -> list[BudgetView]:
    """The lines of `budget_views`, periods by the database's clock (`clock`: tests inject
    one; the API's is `app.state.period_clock`). Nothing is read when no budget is set."""
    if not budget_periods(config):
        return []
    with db.read() as s:
        when = clock(s.connection())
        used = budget_usage.used_in(s, budget_windows(config, when, team))
    return budget_views(config, used, when, team)
