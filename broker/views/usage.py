"""Usage report: GPU-hours used, their cost, and wasted GPU-hours by kind, per team, pool,
flavor or user, over a time window.

Figures come from the ledger's usage and waste entries (broker/ledger.py), which book an
attempt once, when it ends: a window holds the attempts booked in it, whole (an attempt that
ran across the window's start counts entirely in the window it ended in). Attempts still
running are in no report yet. `cost` is GPU-hours x the flavor's and the pool's cost weights
as the ledger stored it; entries booked before costs were numeric (revision 0007) have none
and their hours show in `unpriced_gpu_hours`. Waste is a part of usage, never added to it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, Field

from broker.ledger import LedgerKind
from broker.store.db import Database
from broker.store.reports import GroupBy, HoursRow, hours_by, hours_series
from broker.views.budgets import BudgetView

WASTE_FIELDS: dict[str, str] = {
    LedgerKind.WASTE_PREPARING.value: "waste_preparing",
    LedgerKind.WASTE_FAILED.value: "waste_failed",
    LedgerKind.WASTE_LOST.value: "waste_lost",
    LedgerKind.WASTE_PREEMPTED.value: "waste_preempted",
    LedgerKind.WASTE_CANCELLED.value: "waste_cancelled",
    LedgerKind.WASTE.value: "waste_unsplit",
}


class UsageLine(BaseModel):
    key: str
    """The team, pool, flavor or user ('total' on the total line)."""
    gpu_hours: float = 0.0
    cost: float = 0.0
    unpriced_gpu_hours: float = 0.0
    wasted_gpu_hours: float = 0.0
    wasted_cost: float = 0.0
    waste_preparing: float = 0.0
    waste_failed: float = 0.0
    waste_lost: float = 0.0
    """Run since the last checkpoint of attempts the backend lost."""
    waste_preempted: float = 0.0
    waste_cancelled: float = 0.0
    waste_unsplit: float = 0.0
    """Waste booked before revision 0007 as one entry, without its kind."""


CSV_FIELDS = list(UsageLine.model_fields)


class UsageReport(BaseModel):
    by: GroupBy
    start: datetime | None
    end: datetime | None
    team: str | None
    """Set when the report covers one team only (a team token's view)."""
    lines: list[UsageLine]
    total: UsageLine
    budgets: list[BudgetView] = Field(default_factory=list)
    """The GPU-hour budgets in their current periods (broker/views/budgets.py), whatever the
    window: what the hours of the report count against."""


def _add(line: UsageLine, row: HoursRow) -> None:
    if row.kind == LedgerKind.USAGE.value:
        line.gpu_hours += row.gpu_hours
        line.cost += row.cost
        line.unpriced_gpu_hours += row.unpriced_gpu_hours
        return
    name = WASTE_FIELDS.get(row.kind)
    if name is None:
        return
    setattr(line, name, getattr(line, name) + row.gpu_hours)
    line.wasted_gpu_hours += row.gpu_hours
    line.wasted_cost += row.cost


def usage_report(rows: Iterable[HoursRow], by: GroupBy, start: datetime | None,
                 end: datetime | None, team: str | None = None) -> UsageReport:
    """Fold the per-(group, kind) sums into one line per group and a total (pure)."""
    lines: dict[str, UsageLine] = {}
    total = UsageLine(key="total")
    for row in rows:
        _add(lines.setdefault(row.key, UsageLine(key=row.key)), row)
        _add(total, row)
    return UsageReport(by=by, start=start, end=end, team=team,
                       lines=[lines[k] for k in sorted(lines)], total=total)


def read_usage(db: Database, by: GroupBy, start: datetime | None, end: datetime | None,
               team: str | None = None) -> UsageReport:
    """The report from the ledger; `team`: only that team's entries."""
    with db.read() as s:
        rows = list(hours_by(s, by, start, end, team))
    return usage_report(rows, by, start, end, team)


def read_usage_series(db: Database, by: GroupBy, bounds: list[datetime],
                      team: str | None = None) -> list[UsageReport]:
    """The reports of the consecutive windows [bounds[i], bounds[i + 1]), read at once."""
    with db.read() as s:
        rows = hours_series(s, by, bounds, team)
    return [usage_report(r, by, a, b, team)
            for r, a, b in zip(rows, bounds, bounds[1:], strict=False)]


def _cell(text: str) -> str:
    """A key a spreadsheet would run as a formula (user names come from tokens) is quoted."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def to_csv(report: UsageReport) -> str:
    """One header line (`by` names the key column), one line per group, then the total."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([report.by, *CSV_FIELDS[1:]])
    for line in [*report.lines, report.total]:
        values = line.model_dump()
        writer.writerow([_cell(values["key"]), *(f"{values[f]:.6f}" for f in CSV_FIELDS[1:])])
    return out.getvalue()
