"""OIDC bearer tokens (broker/api/oidc.py) against a local issuer whose keys the test makes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import ValidationError

from broker.api.oidc import MIN_REFRESH_S, OidcError, OidcVerifier, looks_like_jwt
from broker.config import ConfigError, OidcAuth, Role
from tests.fixtures.oidc_issuer import AUDIENCE, LocalIssuer

TEAMS = ("vision", "language")


@pytest.fixture
def issuer() -> LocalIssuer:
    return LocalIssuer()


def _verifier(issuer: LocalIssuer, tmp_path: Path, **cfg: Any) -> OidcVerifier:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(issuer.jwks()))
    base: dict[str, Any] = {"issuer": issuer.issuer, "audiences": [AUDIENCE],
                            "jwks_file": str(jwks), "admin_values": ["isthmus-admins"],
                            "team_map": {"ml-language": "language"}}
    return OidcVerifier(OidcAuth(**{**base, **cfg}), TEAMS)


def test_a_valid_token_maps_claims_to_user_team_and_role(
    issuer: LocalIssuer, tmp_path: Path
) -> None:
    v = _verifier(issuer, tmp_path)
    who = v.verify(issuer.token())
    assert (who.name, who.team, who.role) == ("alice", "vision", Role.USER)
    # a group mapped through team_map; the first known team in claim order wins
    who = v.verify(issuer.token(sub="bob", groups=["staff", "ml-language", "vision"]))
    assert (who.name, who.team) == ("bob", "language")
    # a single-string claim works as well as a list
    assert v.verify(issuer.token(groups="vision")).team == "vision"
    admin = v.verify(issuer.token(sub="root", groups=["isthmus-admins"]))
    assert (admin.role, admin.team) == (Role.ADMIN, None)
    # configurable claim names
    v2 = _verifier(issuer, tmp_path, user_claim="email", team_claim="team")
    who = v2.verify(issuer.token(email="carol@example.test", team="language"))
    assert (who.name, who.team) == ("carol@example.test", "language")


WRONG_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)

REFUSED = [
    pytest.param(lambda i: i.token(exp=1_000_000), 401, "expired", id="expired"),
    pytest.param(lambda i: i.token(aud="another-service"), 401, "aud", id="wrong-audience"),
    pytest.param(lambda i: i.token(iss="https://evil.example"), 401, "iss", id="wrong-issuer"),
    pytest.param(lambda i: i.token(key=WRONG_KEY), 401, "signature", id="wrong-key-same-kid"),
    pytest.param(lambda i: i.token(kid="nope", key=WRONG_KEY), 401, "kid 'nope'",
                 id="unknown-kid"),
    pytest.param(lambda i: i.unsigned_token(), 401, "'none' is not accepted", id="alg-none"),
    pytest.param(lambda i: i.hs256_with_public_key(), 401, "'HS256' is not accepted",
                 id="hs256-keyed-with-the-public-key"),
    pytest.param(lambda i: i.token(exp=None), 401, "exp", id="no-expiry"),
    pytest.param(lambda i: i.token(sub=None), 401, "'sub'", id="no-user"),
    pytest.param(lambda i: i.token(sub="x" * 256), 401, "usable user name", id="user-too-long"),
    pytest.param(lambda i: i.token(sub="al\x00ice"), 401, "usable user name", id="user-nul"),
    pytest.param(lambda i: i.token(groups=["marketing"]), 403, "'marketing'",
                 id="team-claim-unknown-here"),
    pytest.param(lambda i: i.token(groups=None), 403, "nothing", id="no-team-claim"),
    pytest.param(lambda i: "eyJhbGciOiJSUzI1NiJ9.garbage.x", 401, "not", id="malformed"),
]


@pytest.mark.parametrize(("make", "status", "says"), REFUSED)
def test_refused_tokens_say_why(issuer: LocalIssuer, tmp_path: Path, make: Any, status: int,
                                says: str) -> None:
    v = _verifier(issuer, tmp_path)
    with pytest.raises(OidcError) as err:
        v.verify(make(issuer))
    assert err.value.status == status
    assert says in str(err.value)


def test_a_key_that_declares_its_algorithm_refuses_another(
    issuer: LocalIssuer, tmp_path: Path
) -> None:
    import jwt

    v = _verifier(issuer, tmp_path, algorithms=["RS256", "PS256"])
    token = jwt.encode(issuer.claims(), issuer.keys["k1"], algorithm="PS256",
                       headers={"kid": "k1"})
    with pytest.raises(OidcError, match="does not match its key's 'RS256'"):
        v.verify(token)


@pytest.mark.parametrize(("cfg", "says"), [
    ({"algorithms": ["HS256"]}, "not allowed"),
    ({"algorithms": ["none"]}, "not allowed"),
    ({"issuer": "http://idp.example.test"}, "https://"),
    ({"jwks_url": "http://10.0.0.1/jwks"}, "https://"),
    ({"audiences": []}, "audiences"),
])
def test_configuration_refuses_unsafe_settings(cfg: dict[str, Any], says: str) -> None:
    base = {"issuer": "https://idp.example.test", "audiences": ["isthmus"]}
    with pytest.raises(ValidationError, match=says):
        OidcAuth(**{**base, **cfg})
    OidcAuth(issuer="http://127.0.0.1:9000", audiences=["isthmus"])  # loopback http is fine


def test_team_map_must_name_configured_teams(issuer: LocalIssuer, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\['research'\]"):
        _verifier(issuer, tmp_path, team_map={"g": "research"})


def test_keys_come_from_the_issuer_discovery_and_follow_rotation(issuer: LocalIssuer) -> None:
    now = [0.0]
    with issuer.serve() as url:
        cfg = OidcAuth(issuer=url, audiences=[AUDIENCE], jwks_cache_s=3600)
        v = OidcVerifier(cfg, TEAMS, clock=lambda: now[0])
        assert v.verify(issuer.token()).name == "alice"
        assert issuer.requests == ["/.well-known/openid-configuration", "/jwks"]
        v.verify(issuer.token())
        assert len(issuer.requests) == 2  # cached
        # the issuer rotates: a token with the new kid makes one reload, not one per request
        issuer.add_key("k2")
        with pytest.raises(OidcError, match="kid 'k2'"):
            v.verify(issuer.token(kid="k2"))  # too soon after the last load
        now[0] += MIN_REFRESH_S
        assert v.verify(issuer.token(kid="k2")).name == "alice"
        assert len(issuer.requests) == 4
        # the issuer goes away: keys already known keep working until they are replaced
    now[0] += 7200
    assert v.verify(issuer.token(kid="k1", iss=url)).name == "alice"


def test_an_issuer_that_cannot_be_reached_at_first_is_a_503(issuer: LocalIssuer) -> None:
    cfg = OidcAuth(issuer="http://127.0.0.1:9", audiences=[AUDIENCE])
    with pytest.raises(OidcError) as err:
        OidcVerifier(cfg, TEAMS).verify(issuer.token())
    assert err.value.status == 503


def test_only_jwt_shaped_tokens_are_tried(issuer: LocalIssuer) -> None:
    assert looks_like_jwt(issuer.token())
    assert not looks_like_jwt("alice-secret")
    assert not looks_like_jwt("a.b.c")
