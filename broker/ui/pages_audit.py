"""Audit: the audit log (admins), newest first, filtered by actor, action and target, as
GET /v1/admin/audit answers it; the export is that route's `format=jsonl`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from broker.api import audit_trail
from broker.api.auth import Principal
from broker.store import audit_log
from broker.ui.render import page
from broker.ui.session import ui_principal

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]
PAGE = 100
MAX_SEQ = 2**62


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request, caller: Caller,
    actor: Annotated[str | None, Query(max_length=255)] = None,
    action: Annotated[str | None, Query(max_length=40)] = None,
    target: Annotated[str | None, Query(max_length=255)] = None,
    before: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
) -> Response:
    if not caller.is_admin:  # as GET /v1/admin/audit
        return page(request, caller, "audit.html", active="audit", records=None,
                    status=403)
    audit_trail.read_of(caller, None)  # the log spans every team: an admin's read
    filters = audit_log.Filters(actor or None, action or None, target or None)
    audit_log.link_before_reading(request.app.state.db)  # every answered call's record
    with request.app.state.db.read() as s:
        records = audit_log.listing(s, filters, PAGE, before)
    older = records[-1].seq if len(records) == PAGE else None
    return page(request, caller, "audit.html", active="audit", records=records,
                older=older, before=before, actor=actor or "", action=action or "",
                target=target or "")
