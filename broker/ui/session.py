"""Who is looking at the dashboard: the bearer token, kept in a cookie after sign-in.

The token sits in an HttpOnly, SameSite=Strict cookie scoped to /ui rather than in
sessionStorage: the pages are server-rendered plain navigations, which a cookie accompanies
with no script at all, and HttpOnly keeps the token out of reach of any script on the page.
SameSite=Strict keeps other sites' pages from making the browser send it; the cookie has no
expiry (it ends with the browser session) and Secure is set when the request came over HTTPS.
The cookie is checked like an Authorization header on every request (broker/api/auth.py), so
a token removed from the configuration ends its sessions too. With `auth.mode: none` every
caller is the local admin and no sign-in is asked for.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from fastapi import Request

from broker.api.auth import LOCAL_ADMIN, Authenticator, Principal
from broker.api.problems import Problem

COOKIE = "isthmus_ui"
TOKEN_MAX = 8192
"""Longer than any static token or OIDC JWT we accept; a longer cookie is not looked at."""


class NeedsSignIn(Exception):  # a redirect, not an error
    """No (valid) token: the handler sends the browser to the sign-in page."""

    def __init__(self, next_path: str, why: str = "") -> None:
        super().__init__(why)
        self.next_path = next_path
        self.why = why


def check_token(request: Request, token: str) -> Principal:
    """The principal of a token typed into the sign-in page (Problem 401/403/503 if none)."""
    auth: Authenticator = request.app.state.authenticator
    if not token or len(token) > TOKEN_MAX:
        raise Problem(401, "unauthenticated", "Invalid token", "the bearer token is not known")
    return auth.authenticate(f"Bearer {token}")


async def ui_principal(request: Request) -> Principal:
    """The caller of a dashboard page. Async on purpose (no worker-thread hop)."""
    auth: Authenticator = request.app.state.authenticator
    if auth.open:
        return LOCAL_ADMIN
    token = request.cookies.get(COOKIE, "")
    if not token:
        raise NeedsSignIn(_here(request))
    try:
        return check_token(request, token)
    except Problem as exc:
        raise NeedsSignIn(_here(request), exc.detail) from None


def scope(caller: Principal) -> str | None:
    """The team whose data a caller sees: None (every team) for an admin, else the token's
    team ('' matches no team: a user token without a team sees nothing, never everything)."""
    return None if caller.is_admin else caller.team or ""


def _here(request: Request) -> str:
    path = request.url.path
    return path + (f"?{request.url.query}" if request.url.query else "")


def safe_next(value: str | None) -> str:
    """Where to go after sign-in: a dashboard path only (never another site)."""
    if not value or "\\" in value or not (value == "/ui" or value.startswith(("/ui/", "/ui?"))):
        return "/ui"
    if any(ord(c) < 0x20 for c in value):
        return "/ui"
    return value


def same_origin(request: Request) -> bool:
    """A form post from a page of this server: its Origin (sent by browsers on POST), when
    given, names this host. Keeps other sites from signing a browser in or out."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def signin_url(next_path: str) -> str:
    return "/ui/signin?next=" + quote(safe_next(next_path), safe="")
