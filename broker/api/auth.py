"""Bearer-token authentication and team scoping.

Tokens are compared by SHA-256 digest in constant time; the token itself is never stored,
logged or echoed. With `auth.mode: none` (loopback only) every caller is a local admin.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request

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

    def authenticate(self, authorization: str | None) -> Principal:
        if self.open:
            return LOCAL_ADMIN
        unauthorised = {"WWW-Authenticate": 'Bearer realm="isthmus"'}
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Problem(
                401, "unauthenticated", "Authentication required",
                "send 'Authorization: Bearer <token>'", headers=unauthorised,
            )
        digest = hashlib.sha256(authorization[7:].strip().encode()).digest()
        found: Principal | None = None
        for known, principal in self._by_digest:
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise Problem(
                401, "unauthenticated", "Invalid token",
                "the bearer token is not known", headers=unauthorised,
            )
        return found


async def principal(request: Request) -> Principal:
    """Async on purpose: a sync dependency would cost a worker-thread hop per request."""
    auth: Authenticator = request.app.state.authenticator
    return auth.authenticate(request.headers.get("authorization"))
