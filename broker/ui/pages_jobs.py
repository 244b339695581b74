"""Queue, jobs and job pages. They call the API's own service functions (routes_jobs) with
the signed-in caller, so scoping and answers are the API's: another team's job is not found."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from broker.api import routes_jobs as api
from broker.api.auth import Principal
from broker.api.guards import DB_INT_MAX
from broker.api.problems import Problem
from broker.domain import JobState
from broker.ui import queue
from broker.ui.render import not_found, page
from broker.ui.session import scope, ui_principal
from broker.views.decisions import read_job_decisions

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]
EVENTS_SHOWN = 300
DECISIONS_SHOWN = 20


def _team(caller: Principal, team: str | None) -> str | None:
    """The team a page shows: a team token's own, whatever it asks; an admin's choice."""
    return (team or None) if caller.is_admin else scope(caller)


def _teams(request: Request) -> list[str]:
    return [t.name for t in request.app.state.config.teams]


@router.get("/queue", response_class=HTMLResponse)
def queue_page(
    request: Request, caller: Caller,
    team: Annotated[str | None, Query(max_length=63)] = None,
    page_no: Annotated[int, Query(alias="page", ge=1, le=queue.MAX_PAGE)] = 1,
) -> Response:
    shown = _team(caller, team)
    with request.app.state.db.read() as s:
        total = queue.count_waiting(s, shown)
        rows = queue.waiting_page(s, shown, page_no)
    pages = max(1, -(-total // queue.PAGE_SIZE))
    return page(request, caller, "queue.html", active="queue", rows=rows, total=total,
                page_no=page_no, pages=min(pages, queue.MAX_PAGE), team=shown,
                teams=_teams(request), first=(page_no - 1) * queue.PAGE_SIZE)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(
    request: Request, caller: Caller,
    team: Annotated[str | None, Query(max_length=63)] = None,
    state: Annotated[list[str] | None, Query(max_length=16)] = None,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    shown = _team(caller, team)
    try:
        states = [JobState(s.upper()) for s in state or [] if s]
    except ValueError:
        return page(request, caller, "error.html", status=422, title="Unknown state",
                    detail=f"states are {', '.join(s.value for s in JobState)}")
    try:
        got = api.page(request, caller, shown, states or None, 50, cursor or None)
    except Problem as exc:
        return page(request, caller, "error.html", status=exc.status, title=exc.title,
                    detail=exc.detail)
    return page(request, caller, "jobs.html", active="jobs", jobs=got.items,
                next_cursor=got.next_cursor, team=shown, teams=_teams(request),
                states=[s.value for s in JobState], chosen=[s.value for s in states])


def _rendered(request: Request, caller: Principal, job_id: str,
              attempts: list[dict[str, Any]]) -> dict[int, str]:
    out: dict[int, str] = {}
    for a in attempts:
        if a["dispatch"] != "created":
            continue
        try:
            body = api.render(job_id, int(a["number"]), request, caller).body
            out[int(a["number"])] = bytes(body).decode("utf-8", "replace")
        except Problem as exc:
            if exc.slug != "not-rendered":  # the simulator renders nothing: no section
                out[int(a["number"])] = exc.detail
    return out


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, caller: Caller) -> Response:
    try:
        job = api.job_out(job_id, request, caller)
    except Problem:
        return not_found(request, caller, f"no job with id '{job_id}'")
    explained = api.explain(job_id, request, caller)
    attempts = api.attempts(job_id, request, caller)
    timeline = api.timeline(job_id, request, caller)
    events = api.events(job_id, request, caller)
    # as GET /v1/jobs/{id}/decisions: a decision stood until the job stopped waiting
    waiting_until = None if job.state == JobState.QUEUED else job.updated_at
    decisions = read_job_decisions(request.app.state.db, job_id, waiting_until, DECISIONS_SHOWN)
    return page(
        request, caller, "job.html", active="jobs", job=job,
        explanation=explained.get("explanation"), considered_at=explained["considered_at"],
        attempts=attempts, timeline=timeline, rendered=_rendered(request, caller, job_id,
                                                                  attempts),
        events=events[-EVENTS_SHOWN:], events_total=len(events),
        decisions=decisions,
    )


@router.get("/jobs/{job_id}/logs", response_class=HTMLResponse)
def logs_page(
    job_id: str, request: Request, caller: Caller,
    attempt: Annotated[int | None, Query(ge=1, le=DB_INT_MAX)] = None,
    rank: Annotated[int | None, Query(ge=0, le=65535)] = None,
) -> Response:
    try:
        job = api.job_out(job_id, request, caller)
    except Problem:
        return not_found(request, caller, f"no job with id '{job_id}'")
    try:
        got: dict[str, Any] | None = api.logs(job_id, request, caller, attempt, rank, 500)
        problem = ""
    except Problem as exc:
        got, problem = None, exc.detail
    return page(request, caller, "logs.html", active="jobs", job=job, logs=got,
                problem=problem)
