"""policies.budgets: period bounds (table-driven), which spent budget applies to a job, the
warning fractions reached, and both enforcements inside an admission cycle."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.domain.reasons import Reason
from policies.budgets import Budget, BudgetInputs, Period, crossed, period_bounds
from policies.cycle import admission_cycle
from policies.preemption import Preemptor
from policies.types import PendingJob
from tests.unit.policies.builders import at, inventory, make_job, make_pool, q, quota_config
from tests.unit.policies.builders import running as running_job
from tests.unit.policies.builders import usage as usage_of


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


PERIODS = [
    ("day", "2026-12-05T09:30", "2026-12-05T00:00", "2026-12-06T00:00"),
    ("day at midnight", "2026-12-31T00:00", "2026-12-31T00:00", "2027-01-01T00:00"),
    ("week from monday", "2026-12-05T09:30", "2026-11-30T00:00", "2026-12-07T00:00"),
    ("week across a year", "2027-01-01T12:00", "2026-12-28T00:00", "2027-01-04T00:00"),
    ("month", "2026-11-29T23:59", "2026-11-01T00:00", "2026-12-01T00:00"),
    ("december", "2026-12-05T09:30", "2026-12-01T00:00", "2027-01-01T00:00"),
]


@pytest.mark.parametrize(("now", "start", "renews", "period"),
                         [(n, s, r, c.split()[0]) for c, n, s, r in PERIODS],
                         ids=[c[0] for c in PERIODS])
def test_period_bounds(now: str, start: str, renews: str, period: Period) -> None:
    assert period_bounds(period, t(now)) == (t(start), t(renews))


def budget(used: float, *, user: str | None = None, enforce: str = "stop",
           period: Period = "month", hours: float = 100) -> Budget:
    start, renews = period_bounds(period, t("2026-12-05T09:30"))
    return Budget("vision", user, period, hours, used, start, renews, (0.5, 0.8),
                  enforce)  # type: ignore[arg-type]


def job(user: str = "ann", priority: int = 100) -> PendingJob:
    return PendingJob(id="j", team="vision", user=user, replicas=1, gpus_per_replica=8,
                      flavors=("a100",), submitted_at=t("2026-12-05T09:00"), priority=priority,
                      priority_class="normal", can_preempt=True)


VERDICTS = [
    ("nothing spent", [budget(99.9)], None),
    ("team spent", [budget(100)], "stop"),
    ("another user's budget", [budget(500, user="ben")], None),
    ("my user budget", [budget(500, user="ann")], "stop"),
    ("lowest", [budget(120, enforce="lowest")], "lowest"),
    ("stop wins over lowest", [budget(120, enforce="lowest"),
                               budget(9, period="day", hours=8)], "stop"),
]


@pytest.mark.parametrize(("budgets", "enforce"), [(b, e) for _, b, e in VERDICTS],
                         ids=[c[0] for c in VERDICTS])
def test_verdict(budgets: list[Budget], enforce: str | None) -> None:
    v = BudgetInputs({"vision": tuple(budgets)}).verdict(job())
    assert (v.enforce if v else None) == enforce
    if enforce == "stop":
        assert v is not None and v.reason is Reason.BudgetExhausted


def test_the_waiting_message_names_budget_period_and_renewal() -> None:
    v = BudgetInputs({"vision": (budget(100),)}).verdict(job())
    assert v is not None
    assert v.message == ("the 100 GPU-hour month budget of team vision "
                         "(teams[vision].budgets[month]) is spent; it renews at "
                         "2027-01-01T00:00Z")
    # stable while hours keep being booked (else each booking would append an event per job)
    assert BudgetInputs({"vision": (budget(140),)}).verdict(job()) == v


@pytest.mark.parametrize(("used", "reached"), [(49, ()), (50, (0.5,)), (80, (0.5, 0.8)),
                                               (100, (0.5, 0.8, 1.0))])
def test_fractions_reached(used: float, reached: tuple[float, ...]) -> None:
    assert crossed(budget(used)) == reached


QUOTAS = quota_config({"vision": ("research", {"h100": q(64)}),
                       "language": ("research", {"h100": q(64)})})


def test_a_spent_stop_budget_keeps_its_team_waiting_and_no_other() -> None:
    mine = make_job().team("vision").gpus(8).build()
    theirs = make_job().team("language").gpus(8).build()
    spent = BudgetInputs({"vision": (budget(100),)})
    res = admission_cycle([mine, theirs], inventory(make_pool("p1").shape(1, 1, 4)),
                          QUOTAS, usage_of(), at(0), budgets=spent).by_job()
    assert not res[mine.id].admitted and res[mine.id].reason is Reason.BudgetExhausted
    assert res[theirs.id].admitted


def test_lowest_enforcement_orders_as_the_lowest_class_and_never_preempts() -> None:
    urgent = make_job().team("vision").gpus(8).priority(1000, preempting=True) \
        .submitted(-10).build()
    normal = make_job().team("language").gpus(8).priority(100).submitted(-1).build()
    inv = inventory(make_pool("p1").shape(1, 1, 1))
    lowest = BudgetInputs({"vision": (budget(100, enforce="lowest"),)}, 0, "low")
    res = admission_cycle([urgent, normal], inv, QUOTAS, usage_of(), at(0),
                          budgets=lowest).by_job()
    assert res[normal.id].admitted and not res[urgent.id].admitted
    assert "as priority class low, without preempting" in res[urgent.id].message
    # alone, it is admitted, and says at which class
    alone = admission_cycle([urgent], inv, QUOTAS, usage_of(), at(0), budgets=lowest)
    d = alone.decisions[0]
    assert d.admitted and "as priority class low" in d.message
    # on a full pool it would preempt lower work: as the lowest class it does not
    full = inventory(make_pool("p1").shape(1, 1, 1).use_all_but({}))
    pre = Preemptor([running_job("r", priority=50)], QUOTAS, at(0))
    waits = admission_cycle([urgent], full, QUOTAS, usage_of(), at(0), preemptor=pre,
                            budgets=lowest).decisions[0]
    assert not waits.admitted and not waits.victims
    unlimited = admission_cycle([urgent], full, QUOTAS, usage_of(), at(0),
                                preemptor=pre).decisions[0]
    assert unlimited.victims  # the same job without the budget would preempt
