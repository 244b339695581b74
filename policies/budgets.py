"""GPU-hour budgets per team and per user of a team, per period. Pure.

A budget allows `gpu_hours` per period: a UTC day, an ISO week (from Monday 00:00 UTC) or a
calendar month (UTC). What is used is summed by the caller from the ledger's daily sums (an
attempt's hours count on the day it ends) and passed in with the period's bounds, which
`period_bounds` computes from a clock the caller reads (the database's).

Admission asks `BudgetInputs.verdict(job)` at the heads of the cycle: when a budget that
applies to the job (its team's, or its user's in its team) is spent (used >= gpu_hours), its
enforcement applies: `stop` keeps the job QUEUED with BudgetExhausted and a message naming
the budget, its period and when it renews; `lowest` admits the job only as the lowest priority
class (ordered as that class, never preempting; its attempt keeps that class as a victim). A
spent `stop` budget wins over a `lowest` one.
Nothing is charged per admission: hours are used while jobs run, not when they are admitted.

`crossed(budget)` lists the warning fractions a budget has reached (1.0 included): the caller
tells each once per budget, fraction and period.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from broker.domain.reasons import Reason
from policies.types import PendingJob

Period = Literal["day", "week", "month"]
Enforce = Literal["stop", "lowest"]


def period_bounds(period: Period, now: datetime) -> tuple[datetime, datetime]:
    """[start, renews) of the period holding `now`, in UTC."""
    day = now.astimezone(UTC).date()
    if period == "day":
        start = day
        end = day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = date(start.year + start.month // 12, start.month % 12 + 1, 1)
    return _midnight(start), _midnight(end)


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget in its current period: `user` None for the whole team's; `field` is where
    isthmus.yaml sets it (`teams[vision].budgets[month]`)."""

    team: str
    user: str | None
    period: Period
    gpu_hours: float
    used: float
    start: datetime
    renews: datetime
    warn_at: tuple[float, ...] = (0.8,)
    enforce: Enforce = "stop"

    @property
    def field(self) -> str:
        kind = "budgets" if self.user is None else "user_budgets"
        return f"teams[{self.team}].{kind}[{self.period}]"

    @property
    def spent(self) -> bool:
        return self.used >= self.gpu_hours

    @property
    def fraction(self) -> float:
        return self.used / self.gpu_hours

    @property
    def who(self) -> str:
        return f"team {self.team}" if self.user is None else \
            f"user {self.user} of team {self.team}"

    def describe(self) -> str:
        """What a waiting job's message says: stable through the period (not the hours used,
        which move as jobs end: a message that changed would append an event per job)."""
        return (f"the {self.gpu_hours:g} GPU-hour {self.period} budget of {self.who} "
                f"({self.field}) is spent; it renews at {_iso(self.renews)}")


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def crossed(budget: Budget) -> tuple[float, ...]:
    """The warning fractions (and 1.0) the budget's use has reached, ascending."""
    marks = sorted({*budget.warn_at, 1.0})
    return tuple(m for m in marks if budget.used >= m * budget.gpu_hours)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`stop`: the job waits (`reason`, `message`); `lowest`: it is admitted only as the
    lowest priority class, `message` says why."""

    enforce: Enforce
    reason: Reason | None
    message: str


@dataclass(frozen=True, slots=True)
class BudgetInputs:
    """Every budget in its current period, by team, and the lowest priority class (its value
    and name) that `lowest` enforcement admits at."""

    by_team: Mapping[str, tuple[Budget, ...]] = field(default_factory=dict)
    lowest_priority: int = 0
    lowest_class: str = "low"

    def verdict(self, job: PendingJob) -> Verdict | None:
        """The enforcement of the spent budgets that apply to `job` (stop first), or None."""
        spent = [b for b in self.by_team.get(job.team, ())
                 if b.spent and (b.user is None or b.user == job.user)]
        if not spent:
            return None
        stop = [b for b in spent if b.enforce == "stop"]
        if stop:
            return Verdict("stop", Reason.BudgetExhausted, _first(stop).describe())
        b = _first(spent)
        return Verdict("lowest", None, f"as priority class {self.lowest_class}, without "
                       f"preempting: {b.describe()}")

    def demoted(self, job: PendingJob) -> PendingJob:
        """`job` as the lowest priority class, never preempting."""
        return replace(job, priority=min(job.priority, self.lowest_priority),
                       priority_class=self.lowest_class if job.priority > self.lowest_priority
                       else job.priority_class, can_preempt=False, preempts_across_teams=False)


def _first(budgets: list[Budget]) -> Budget:
    """The budget to name: the one renewing last (the job waits for it), then by field."""
    return max(budgets, key=lambda b: (b.renews, b.field))
