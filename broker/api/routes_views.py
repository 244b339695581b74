"""Admin views: pools, quotas, usage reports and the decision log (read models in
broker/views). Team tokens see their own team's quotas, usage and jobs' decisions; pool views
are shared capacity (who drained a pool is shown to admins only); cycles are admin-only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from broker.api import audit_trail
from broker.api.auth import Principal, principal
from broker.api.guards import DB_INT_MAX
from broker.api.job_refs import JobRef
from broker.api.problems import Problem, problem_responses
from broker.api.routes_admin import Admin
from broker.api.routes_jobs import _visible_job
from broker.config import IsthmusConfig
from broker.domain.clock import utcnow
from broker.domain.states import JobState
from broker.store.db import Database
from broker.store.reports import GroupBy
from broker.views.budgets import BudgetView, read_budgets
from broker.views.decisions import (
    MAX_PAGE,
    CycleView,
    JobDecisionView,
    VictimView,
    read_cycles,
)
from broker.views.decisions import read_job_decisions as read_decisions
from broker.views.limits import LimitView, read_limits
from broker.views.pools import PoolView, read_pools
from broker.views.quotas import QuotaView, read_quotas
from broker.views.team_queues import QueueView, read_queues
from broker.views.usage import UsageReport, read_usage, to_csv

router = APIRouter(tags=["views"], responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


def _state(request: Request) -> tuple[IsthmusConfig, Database]:
    return request.app.state.config, request.app.state.db


@router.get("/v1/pools", response_model=list[PoolView])
async def pools(request: Request, caller: Caller) -> list[PoolView]:
    """Every pool: capacity, free GPUs, Isthmus vs foreign, queues, drain, reachability and
    inventory age (the control plane's last inventory; no backend is asked), racks and blocks
    with their free GPUs."""
    config, db = _state(request)
    runtime = request.app.state.runtime
    answers = runtime.plane.last_inventories() if runtime is not None else {}
    views = await run_in_threadpool(read_pools, config, db, answers, utcnow())
    if not caller.is_admin:
        views = [v.model_copy(update={"drained_by": None}) for v in views]
    return views


@router.get("/v1/quotas", response_model=list[QuotaView])
async def quotas(request: Request, caller: Caller) -> list[QuotaView]:
    """Per team and flavor: nominal, borrowing and lending limits, used, borrowed, lent out,
    waiting demand. A team token sees its team's lines."""
    config, db = _state(request)
    team = None if caller.is_admin else caller.team or ""
    return await run_in_threadpool(read_quotas, config, db, team)


@router.get("/v1/limits", response_model=list[LimitView])
async def limits(request: Request, caller: Caller) -> list[LimitView]:
    """Concurrency limits against live counts: per team (running jobs, queued jobs, GPUs
    held) and per user with jobs. A team token sees its team's lines."""
    config, db = _state(request)
    team = None if caller.is_admin else caller.team or ""
    return await run_in_threadpool(read_limits, config, db, team)


@router.get("/v1/queues", response_model=list[QueueView])
async def queue_lines(request: Request, caller: Caller) -> list[QueueView]:
    """Each team's queues (`teams[].queues`; a team without queues has one, `default`): weight,
    GPUs held, jobs waiting, GPUs held per unit of weight (the lowest goes next among the
    team's queues). A team token sees its team's lines."""
    config, db = _state(request)
    team = None if caller.is_admin else caller.team or ""
    return await run_in_threadpool(read_queues, config, db, team)


@router.get("/v1/budgets", response_model=list[BudgetView])
async def budget_lines(request: Request, caller: Caller) -> list[BudgetView]:
    """GPU-hour budgets in their current periods (by the database's clock) against the hours
    used: per team, and per user with hours booked. A team token sees its team's lines."""
    config, db = _state(request)
    team = None if caller.is_admin else caller.team or ""
    return await run_in_threadpool(read_budgets, config, db, team, request.app.state.period_clock)


def _instant(name: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text)
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 moved across UTC
        raise Problem(422, "invalid-request", "Invalid request",
                      f"{name}: not an ISO 8601 date or time: {text[:40]!r}",
                      [{"field": name, "message": "an ISO 8601 date or time"}]) from None


@router.get(
    "/v1/reports/usage", response_model=UsageReport,
    responses={200: {"content": {"text/csv": {}}}},
)
async def usage_report(
    request: Request, caller: Caller,
    start: Annotated[str | None, Query(alias="from", max_length=40,
                                       description="ISO date or time (UTC unless given)")] = None,
    end: Annotated[str | None, Query(alias="to", max_length=40,
                                     description="exclusive; ISO date or time")] = None,
    by: Annotated[GroupBy, Query()] = "team",
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> UsageReport | Response:
    """GPU-hours used, cost and wasted GPU-hours by kind per team, pool, flavor or user, of
    the attempts booked (ended) in [from, to), and (JSON) the GPU-hour budgets in their
    current periods. A team token sees its team's usage and budgets only."""
    t0, t1 = _instant("from", start), _instant("to", end)
    if t0 is not None and t1 is not None and t1 <= t0:
        raise Problem(422, "invalid-request", "Invalid request", "to: must be after from",
                      [{"field": "to", "message": "must be after from"}])
    config, db = _state(request)
    team = None if caller.is_admin else caller.team or ""
    audit_trail.read_of(caller, team)
    report = await run_in_threadpool(read_usage, db, by, t0, t1, team)
    report.budgets = await run_in_threadpool(read_budgets, config, db, team,
                                             request.app.state.period_clock)
    if format == "csv":
        return Response(to_csv(report), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="usage-by-{by}.csv"'})
    return report


@router.get("/v1/admin/cycles", response_model=list[CycleView],
            responses=problem_responses(403))
async def cycles(
    request: Request, caller: Admin,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    before: Annotated[int | None, Query(ge=1, le=DB_INT_MAX,
                                        description="cycles older than this id")] = None,
) -> list[CycleView]:
    """Admission cycles, newest first: inputs digest, counts, admissions, victims."""
    _, db = _state(request)
    return await run_in_threadpool(read_cycles, db, limit, before)


@router.get("/v1/jobs/{job_id}/decisions", response_model=list[JobDecisionView],
            responses=problem_responses(404))
async def job_decisions(
    job_id: JobRef, request: Request, caller: Caller,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    before: Annotated[int | None, Query(ge=1, le=DB_INT_MAX,
                                        description="decisions of cycles older than this")] = None,
) -> list[JobDecisionView]:
    """The admission cycles' decisions about the job, newest first: verdict per pool, victims
    chosen, the cycle's inputs digest (logged when the decision changed; `repeated_in`
    counts the cycles that repeated it)."""
    _, db = _state(request)
    job = await run_in_threadpool(_visible_job, db, job_id, caller)
    waiting_until = None if job.state == JobState.QUEUED.value else job.updated_at
    decisions = await run_in_threadpool(read_decisions, db, job.id, waiting_until, limit,
                                        before)
    if caller.is_admin:
        return decisions
    return [d.model_copy(update={"victims": [_masked(v, job.team) for v in d.victims]})
            for d in decisions]


def _masked(victim: VictimView, team: str) -> VictimView:
    """Another team's victim, as the preempting team sees it: what it freed, not whose."""
    if victim.team == team:
        return victim
    return victim.model_copy(update={"job_id": "a job of another team",
                                     "team": "another team"})
