"""Decisions: the admission cycles (admins), from the decision log's read model
(broker/views/decisions.py). A job's own decisions are on its page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from broker.api.auth import Principal
from broker.api.guards import DB_INT_MAX
from broker.ui.render import page
from broker.ui.session import ui_principal
from broker.views.decisions import read_cycles

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]
PAGE = 50


@router.get("/decisions", response_class=HTMLResponse)
def decisions(
    request: Request, caller: Caller,
    before: Annotated[int | None, Query(ge=1, le=DB_INT_MAX)] = None,
) -> Response:
    if not caller.is_admin:  # as GET /v1/admin/cycles: cycles span every team
        return page(request, caller, "decisions.html", active="decisions", cycles=None,
                    older=None, before=None, status=403)
    cycles = read_cycles(request.app.state.db, PAGE, before)
    older = cycles[-1].id if len(cycles) == PAGE else None
    return page(request, caller, "decisions.html", active="decisions", cycles=cycles,
                older=older, before=before)
