"""Approvals: jobs whose priority class waits for an admin's decision (admins). The dashboard
takes no actions, so the page names the commands (`isthmus admin approve / refuse`) and the
API calls that decide."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from broker.api.auth import Principal
from broker.store import approvals
from broker.ui.render import page
from broker.ui.session import ui_principal

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]
SHOWN = 500


@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(request: Request, caller: Caller) -> Response:
    if not caller.is_admin:  # as GET /v1/admin/approvals
        return page(request, caller, "approvals.html", active="approvals", jobs=None,
                    status=403)
    with request.app.state.db.read() as s:
        jobs = approvals.awaiting(s, limit=SHOWN)
    return page(request, caller, "approvals.html", active="approvals", jobs=jobs,
                shown=SHOWN)
