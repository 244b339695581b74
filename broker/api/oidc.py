"""OpenID Connect bearer tokens: JWTs signed by a site's issuer, checked against its JWKS.

Order of checks for a token (each refusal says which check failed, never the token):
1. the header's `alg` is one the configuration allows (asymmetric only: `none` and HS* are
   refused before any key is looked at, so a public key can never serve as an HMAC secret);
2. the signing key is found by `kid` in the issuer's JWKS (reloaded when a token names a kid
   it does not know, at most every `MIN_REFRESH_S`, so forged kids cannot hammer the issuer);
   a key that declares its own `alg` must match the header;
3. the signature, `exp` (with leeway), `iss` and `aud` (PyJWT, all three required);
4. the claims map to a caller: the user claim names it, the admin claim makes it an admin,
   the team claim (a string or a list, mapped through `team_map`) must name a team the
   configuration knows, else the caller is authenticated but refused (403).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from broker.config import OidcAuth, Role
from broker.domain.text import control_character
from broker.logs import get_logger

log = get_logger(__name__)
MIN_REFRESH_S = 10.0
FETCH_TIMEOUT_S = 5.0

FetchJson = Callable[[str], dict[str, Any]]


MAX_USER_NAME = 255
"""The submitter column's width."""


class OidcError(Exception):
    """A refused token: 401 (not authenticated), 403 (authenticated, not allowed) or 503
    (the issuer's keys cannot be loaded). The message is safe to return to the caller."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class SigningKey:
    jwk: jwt.PyJWK
    alg: str | None  # the algorithm the key declares for itself, if any

    @property
    def kid(self) -> str | None:
        return self.jwk.key_id


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    team: str | None
    role: Role


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts, the header a JSON object (`eyJ` = `{"`)."""
    return token.startswith("eyJ") and token.count(".") == 2


def http_get_json(url: str) -> dict[str, Any]:
    import httpx

    resp = httpx.get(url, timeout=FETCH_TIMEOUT_S, follow_redirects=False)
    resp.raise_for_status()
    data = resp.json()
    if not isinstance(data, dict):
        raise ValueError(f"{url}: expected a JSON object")
    return data


class KeySet:
    """The issuer's signing keys, from a file or fetched (and cached for `jwks_cache_s`).

    Reloads block the calling request, once per cache period: a short timeout bounds that.
    A failed reload keeps the keys already known (an issuer outage must not lock everyone
    out while their tokens are still valid).
    """

    def __init__(self, cfg: OidcAuth, fetch: FetchJson = http_get_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: list[SigningKey] | None = None
        self._loaded_at = 0.0

    def key(self, kid: str | None) -> SigningKey:
        with self._lock:
            now = self._clock()
            if self._keys is None or now - self._loaded_at >= self.cfg.jwks_cache_s:
                self._reload(now)
            found = self._find(kid)
            if found is None and now - self._loaded_at >= MIN_REFRESH_S:
                self._reload(now)  # the issuer may have rotated its keys
                found = self._find(kid)
        if found is None:
            raise OidcError(f"the signing key (kid {kid!r}) is not in the issuer's key set")
        return found

    def _find(self, kid: str | None) -> SigningKey | None:
        keys = self._keys or []
        if kid is None:
            return keys[0] if len(keys) == 1 else None
        return next((k for k in keys if k.kid == kid), None)

    def _jwks_url(self) -> str:
        if self.cfg.jwks_url:
            return self.cfg.jwks_url
        doc = self._fetch(self.cfg.issuer.rstrip("/") + "/.well-known/openid-configuration")
        url = doc.get("jwks_uri")
        if not isinstance(url, str) or not url:
            raise ValueError("the issuer's discovery document has no jwks_uri")
        return url

    def _reload(self, now: float) -> None:
        try:
            if self.cfg.jwks_file:
                data = json.loads(Path(self.cfg.jwks_file).read_text())
            else:
                data = self._fetch(self._jwks_url())
            raw = data.get("keys") if isinstance(data, dict) else None
            if not isinstance(raw, list):
                raise ValueError("the JWKS has no 'keys' list")
        except Exception as exc:  # any failure to load keeps what we had
            log.warning("OIDC: cannot load the issuer's keys: %s", exc)
            self._loaded_at = now
            if self._keys is None:
                raise OidcError("the issuer's signing keys cannot be loaded", 503) from None
            return
        keys = []
        for jwk in raw:
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
                continue
            try:
                alg = jwk.get("alg")
                keys.append(SigningKey(jwt.PyJWK(jwk), alg if isinstance(alg, str) else None))
            except jwt.PyJWTError as exc:  # unsupported key types are skipped, not fatal
                log.info("OIDC: skipping key %s: %s", jwk.get("kid"), exc)
        self._keys = keys
        self._loaded_at = now


def _values(claim: Any) -> list[str]:
    if isinstance(claim, str):
        return [claim]
    if isinstance(claim, list):
        return [v for v in claim if isinstance(v, str)]
    return []


class OidcVerifier:
    def __init__(self, cfg: OidcAuth, teams: Collection[str],
                 fetch: FetchJson = http_get_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        unknown = sorted(t for t in cfg.team_map.values() if t not in teams)
        if unknown:
            from broker.config import ConfigError

            raise ConfigError(f"auth.oidc.team_map: team(s) {unknown} are not in teams")
        self.cfg = cfg
        self.teams = frozenset(teams)
        self.keys = KeySet(cfg, fetch, clock)

    def verify(self, token: str) -> Identity:
        cfg = self.cfg
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise OidcError("the bearer token is not a well-formed JWT") from None
        alg = header.get("alg")
        if alg not in cfg.algorithms:
            raise OidcError(f"token algorithm {alg!r} is not accepted (allowed: "
                            f"{', '.join(cfg.algorithms)})")
        kid = header.get("kid")
        key = self.keys.key(kid if isinstance(kid, str) else None)
        if key.alg is not None and key.alg != alg:
            raise OidcError(f"token algorithm {alg!r} does not match its key's {key.alg!r}")
        try:
            claims = jwt.decode(
                token, key=key.jwk.key, algorithms=[alg], audience=cfg.audiences,
                issuer=cfg.issuer, leeway=cfg.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise OidcError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise OidcError("the token is not meant for this service (aud)") from None
        except jwt.InvalidIssuerError:
            raise OidcError("the token comes from another issuer (iss)") from None
        except jwt.InvalidSignatureError:
            raise OidcError("the token's signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise OidcError(f"the token is not valid: {exc}") from None
        return self.identity(claims)

    def identity(self, claims: dict[str, Any]) -> Identity:
        cfg = self.cfg
        name = claims.get(cfg.user_claim)
        if not isinstance(name, str) or not name:
            raise OidcError(f"the token has no '{cfg.user_claim}' claim naming the user")
        if len(name) > MAX_USER_NAME or control_character(name) is not None:
            # stored as the submitter of every job (255 characters, no NUL on PostgreSQL)
            raise OidcError(f"the token's '{cfg.user_claim}' claim is not a usable user name "
                            f"(at most {MAX_USER_NAME} characters, no control characters)")
        admin = bool(set(_values(claims.get(cfg.admin_claim))) & set(cfg.admin_values))
        given = _values(claims.get(cfg.team_claim))
        # The first known team in claim order: a caller acts for one team at a time.
        team = next((t for t in (cfg.team_map.get(v, v) for v in given) if t in self.teams),
                    None)
        if team is None and not admin:
            shown = ", ".join(repr(v) for v in given[:5]) or "nothing"
            raise OidcError(f"the token's '{cfg.team_claim}' claim names no team configured "
                            f"here (it has {shown})", 403)
        return Identity(name, team, Role.ADMIN if admin else Role.USER)
