"""Bearer-token authentication and team scoping.

Tokens are compared by SHA-256 digest in constant time; the token itself is never stored,
logged or echoed. A token that is not a known static one and looks like a JWT is checked as
an OIDC token when `auth.oidc` is configured (broker/api/oidc.py). With `auth.mode: none`
(loopback only) every caller is a local admin.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request

from broker.api import audit_trail
from broker.api.oidc import OidcError, OidcVerifier, looks_like_jwt
from broker.api.problems import Problem
from broker.config import IsthmusConfig, Role


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    team: str | None
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def can_see(self, team: str) -> bool:
        return self.is_admin or self.team == team


LOCAL_ADMIN = Principal("local", None, Role.ADMIN)


class Authenticator:
    def __init__(self, config: IsthmusConfig) -> None:
        self.open = config.auth.mode == "none"
        self._by_digest: list[tuple[bytes, Principal]] = []
        for tok in config.auth.tokens:
            digest = tok.digest()
            if digest is not None:
                self._by_digest.append(
                    (bytes.fromhex(digest), Principal(tok.name, tok.team, tok.role))
                )
        oidc = config.auth.oidc
        self._oidc = OidcVerifier(oidc, [t.name for t in config.teams]) if oidc else None

    def authenticate(self, authorization: str | None) -> Principal:
        if self.open:
            audit_trail.saw_caller(LOCAL_ADMIN)
            return LOCAL_ADMIN
        unauthorised = {"WWW-Authenticate": 'Bearer realm="isthmus"'}
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Problem(
                401, "unauthenticated", "Authentication required",
                "send 'Authorization: Bearer <token>'", headers=unauthorised,
            )
        token = authorization[7:].strip()
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for known, principal in self._by_digest:
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None and self._oidc is not None and looks_like_jwt(token):
            found = self._from_oidc(token, unauthorised)
        if found is None:
            raise Problem(
                401, "unauthenticated", "Invalid token",
                "the bearer token is not known", headers=unauthorised,
            )
        audit_trail.saw_caller(found)
        return found

    def _from_oidc(self, token: str, unauthorised: dict[str, str]) -> Principal:
        assert self._oidc is not None
        try:
            who = self._oidc.verify(token)
        except OidcError as exc:
            if exc.status == 403:
                raise Problem(403, "forbidden", "Not allowed", str(exc)) from None
            if exc.status == 503:
                raise Problem(503, "auth-unavailable", "Cannot check the token", str(exc),
                              headers={"Retry-After": "10"}) from None
            raise Problem(401, "unauthenticated", "Invalid token", str(exc),
                          headers=unauthorised) from None
        return Principal(who.name, who.team, who.role)


async def principal(request: Request) -> Principal:
    """Async on purpose: a sync dependency would cost a worker-thread hop per request."""
    auth: Authenticator = request.app.state.authenticator
    return auth.authenticate(request.headers.get("authorization"))
