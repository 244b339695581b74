"""Sign-in and sign-out of the dashboard."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from broker.api.problems import Problem
from broker.ui.render import SECURITY_HEADERS, page
from broker.ui.session import COOKIE, TOKEN_MAX, check_token, safe_next, same_origin

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/signin", response_class=HTMLResponse)
async def signin_form(request: Request, next: str = "/ui") -> Response:
    if request.app.state.authenticator.open:
        return RedirectResponse(safe_next(next), status_code=303)
    return page(request, None, "signin.html", next=safe_next(next), error="")


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request) -> Response:
    if not same_origin(request):
        return page(request, None, "signin.html", status=403, next="/ui",
                    error="Sign in from this server's own sign-in page.")
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    token = (form.get("token") or [""])[0].strip()
    nxt = safe_next((form.get("next") or ["/ui"])[0])
    try:
        check_token(request, token)
    except Problem as exc:
        return page(request, None, "signin.html", status=exc.status, next=nxt,
                    error=exc.detail if exc.status != 401 else "That token is not known.")
    response = RedirectResponse(nxt, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    response.set_cookie(
        COOKIE, token[:TOKEN_MAX], path="/ui", httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    if not same_origin(request):
        return RedirectResponse("/ui", status_code=303)
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response
