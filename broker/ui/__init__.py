"""The web dashboard at /ui: server-rendered pages over the same services as the API.

Pages reuse the API's own service functions (broker/api/routes_jobs.py) and read models, so
a page shows exactly what the API answers the same caller; team tokens see their team only.
Every asset (templates, CSS, the one small script) ships in this package; nothing is fetched
from elsewhere, which the pages' Content-Security-Policy also enforces.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from broker.api.guards import plain_query
from broker.ui.assets import HERE
from broker.ui.session import NeedsSignIn, signin_url
from broker.ui.timing import ServerTiming


def mount(app: FastAPI) -> None:
    """Serve the dashboard under /ui (left out of the OpenAPI document: pages, not API)."""
    from broker.ui.pages import router as base_router
    from broker.ui.pages_approvals import router as approvals_router
    from broker.ui.pages_audit import router as audit_router
    from broker.ui.pages_decisions import router as decisions_router
    from broker.ui.pages_fleet import router as fleet_router
    from broker.ui.pages_jobs import router as jobs_router
    from broker.ui.pages_submit import router as submit_router

    for router in (base_router, fleet_router, jobs_router, decisions_router, approvals_router,
                   submit_router, audit_router):
        app.include_router(router, dependencies=[Depends(plain_query)])
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.add_middleware(ServerTiming, prefix="/ui")  # outermost: the whole time in the server

    @app.exception_handler(NeedsSignIn)
    async def _sign_in(request: Request, exc: NeedsSignIn) -> Response:
        return RedirectResponse(signin_url(exc.next_path), status_code=303)
