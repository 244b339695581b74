"""Rendering a dashboard page: the templates, the security headers, the navigation."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from broker.api.auth import Principal
from broker.domain.start_window import likely_of
from broker.domain.units import approx_duration as human
from broker.ui import svg
from broker.ui.assets import HERE

TEMPLATES = Jinja2Templates(directory=HERE / "templates")
TEMPLATES.env.globals["svg"] = svg
TEMPLATES.env.filters["human"] = human
TEMPLATES.env.filters["when"] = lambda v: "" if v is None else str(v)[:19].replace("T", " ")
TEMPLATES.env.filters["likely"] = lambda w: likely_of(
    w.model_dump() if hasattr(w, "model_dump") else w) or ""

# Nothing but this origin: no CDN, no inline script or style, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

NAV = (("overview", "/ui", "Overview"), ("queue", "/ui/queue", "Queue"),
       ("jobs", "/ui/jobs", "Jobs"), ("decisions", "/ui/decisions", "Decisions"),
       ("approvals", "/ui/approvals", "Approvals"), ("audit", "/ui/audit", "Audit"),
       ("reports", "/ui/reports", "Reports"), ("submit", "/ui/submit", "Submit"))


def page(request: Request, caller: Principal | None, name: str, active: str = "",
         status: int = 200, **context: Any) -> HTMLResponse:
    ctx = {"caller": caller, "nav": NAV, "active": active,
           "signed_in": caller is not None and not request.app.state.authenticator.open,
           **context}
    response = TEMPLATES.TemplateResponse(request, name, ctx, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def not_found(request: Request, caller: Principal, what: str) -> HTMLResponse:
    return page(request, caller, "error.html", status=404, title="Not found", detail=what)
