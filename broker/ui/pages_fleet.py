"""Overview and Reports: the federation at a glance, drawn from the read models in
broker/views (pools, quotas, GPU-hour budgets, usage), never from queries of their own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from broker import ledger
from broker.api.auth import Principal
from broker.control.inventories import Answer
from broker.ui import queue
from broker.ui.render import page
from broker.ui.session import scope, ui_principal
from broker.views.budgets import read_budgets
from broker.views.pools import PoolView, read_pools
from broker.views.quotas import quota_views
from broker.views.team_queues import read_queues
from broker.views.usage import UsageLine, UsageReport, read_usage_series

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]


def _answers(request: Request) -> Mapping[str, Answer]:
    runtime = request.app.state.runtime
    return runtime.plane.last_inventories() if runtime is not None else {}


def heat(free: int, total: int) -> str:
    """The CSS class of a rack cell: 0 (nothing free) to 5 (all free)."""
    if total <= 0:
        return "heat-0"
    return f"heat-{min(5, round(5 * free / total))}"


@dataclass(frozen=True, slots=True)
class BackendHealth:
    name: str
    status: str
    """reachable, unreachable, or 'no inventory yet' (this process has not asked it yet, or
    runs no control loop)."""
    pools: int
    inventory_age_s: float | None
    note: str


def backends(pools: list[PoolView]) -> list[BackendHealth]:
    """Per backend, from its pools' views: reachable when every pool of it is; not known
    while no pool of it has an inventory and none has an error."""
    by: dict[str, list[PoolView]] = {}
    for p in pools:
        by.setdefault(p.backend, []).append(p)
    out = []
    for name, ps in by.items():
        ages = [p.inventory_age_s for p in ps if p.inventory_age_s is not None]
        notes = sorted({p.note for p in ps if p.note})
        if all(p.reachable for p in ps):
            status = "reachable"
        elif all(p.inventory_at is None and p.note.startswith("no inventory") for p in ps):
            status = "no inventory yet"
        else:
            status = "unreachable"
        out.append(BackendHealth(name, status, len(ps), max(ages) if ages else None,
                                 "; ".join(notes)))
    return out


@router.get("", response_class=HTMLResponse)
def overview(request: Request, caller: Caller) -> Response:
    config, db = request.app.state.config, request.app.state.db
    team = scope(caller)
    pools = read_pools(config, db, _answers(request), datetime.now(UTC))
    if not caller.is_admin:  # as GET /v1/pools: who drained a pool is for admins
        pools = [p.model_copy(update={"drained_by": None}) for p in pools]
    with db.read() as s:
        usage = ledger.usage(s)
        depth = queue.waiting_by_team(s, team)
    # the quota view without its waiting demand per flavor (read_quotas parses every waiting
    # job's spec for it: about 0.3 ms a job, so seconds with thousands waiting); the queue
    # depth per team stands for it here, and GET /v1/quotas has it
    quotas = quota_views(config, usage, {}, team)
    budgets = read_budgets(config, db, team, request.app.state.period_clock)
    with_queues = {t.name for t in config.teams if t.splits_quota}
    queues = [q for q in read_queues(config, db, team) if q.team in with_queues]
    return page(request, caller, "overview.html", active="overview", pools=pools,
                quotas=quotas, budgets=budgets, queues=queues, depth=depth,
                backends=backends(pools), heat=heat)


Range = Literal["hour", "day", "week", "month"]
RANGES: dict[str, tuple[timedelta, int]] = {
    "hour": (timedelta(hours=1), 12), "day": (timedelta(days=1), 12),
    "week": (timedelta(days=7), 7), "month": (timedelta(days=30), 15),
}
"""Each range and its number of bars, all read in one statement (bench/ui.py times them)."""


def _bounds(now: datetime, span: timedelta, n: int) -> list[datetime]:
    """The bars' n + 1 bounds: the last `span` up to now; bars of whole days (week, month)
    are whole UTC days up to the end of today, which the ledger's daily sums answer."""
    step = span / n
    end = now
    if step >= timedelta(days=1):
        end = datetime.combine(now.astimezone(UTC).date() + timedelta(days=1), time(), UTC)
    return [end - span + i * step for i in range(n + 1)]


def _label(at: datetime, span: timedelta) -> str:
    return at.strftime("%H:%M" if span <= timedelta(days=1) else "%m-%d")


def _series(reports: list[UsageReport], field: str) -> dict[str, list[float]]:
    keys = sorted({line.key for r in reports for line in r.lines})
    return {k: [next((float(getattr(x, field)) for x in r.lines if x.key == k), 0.0)
                for r in reports] for k in keys}


def totals(reports: list[UsageReport]) -> UsageReport:
    """The range's report as the sum of its bars' reports (their windows tile the range, and
    every figure of a line is a sum), instead of reading the ledger once more."""
    lines: dict[str, UsageLine] = {}
    total = UsageLine(key="total")
    for r in reports:
        for line in [*r.lines, r.total]:
            into = total if line is r.total else lines.setdefault(line.key, UsageLine(key=line.key))
            for name in UsageLine.model_fields:
                if name != "key":
                    setattr(into, name, getattr(into, name) + getattr(line, name))
    first, last = reports[0], reports[-1]
    return UsageReport(by=first.by, start=first.start, end=last.end, team=first.team,
                       lines=[lines[k] for k in sorted(lines)], total=total)


@router.get("/reports", response_class=HTMLResponse)
def reports(request: Request, caller: Caller, range_: Annotated[
        Range, Query(alias="range")] = "day") -> Response:
    db = request.app.state.db
    team = scope(caller)
    span, n = RANGES[range_]
    bounds = _bounds(datetime.now(UTC), span, n)
    per_bucket = read_usage_series(db, "team", bounds, team)
    labels = [_label(a, span) for a in bounds[:-1]]
    return page(request, caller, "reports.html", active="reports", range_=range_,
                ranges=list(RANGES), labels=labels, whole=totals(per_bucket),
                cost=_series(per_bucket, "cost"),
                waste=_series(per_bucket, "wasted_gpu_hours"),
                hours=_series(per_bucket, "gpu_hours"))
