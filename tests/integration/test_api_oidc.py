"""OIDC tokens through the API and the CLI, beside static tokens (both databases)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.store import Database
from tests.builders import spec
from tests.fixtures.oidc_issuer import AUDIENCE, LocalIssuer
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.wait import wait_until

ROOT_TOKEN = "root-secret"


@pytest.fixture
def issuer() -> LocalIssuer:
    return LocalIssuer()


@pytest.fixture
def config(issuer: LocalIssuer, tmp_path: Path) -> IsthmusConfig:
    import hashlib

    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(issuer.jwks()))
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {
        "mode": "token",
        "tokens": [{"name": "root", "role": "admin",
                    "token_sha256": hashlib.sha256(ROOT_TOKEN.encode()).hexdigest()}],
        "oidc": {"issuer": issuer.issuer, "audiences": [AUDIENCE], "jwks_file": str(jwks),
                 "admin_values": ["isthmus-admins"]},
    }
    return parse_config(data)


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_oidc_callers_are_scoped_like_token_callers(
    db: Database, config: IsthmusConfig, issuer: LocalIssuer
) -> None:
    with TestClient(create_app(config, db)) as c:
        alice = issuer.token(sub="alice", groups=["vision"])
        job = c.post("/v1/jobs", json=spec().dict(), headers=_as(alice))
        assert job.status_code == 201, job.text
        assert job.json()["submitted_by"] == "alice"
        # another team's caller does not see it; a token for another audience is refused
        bob = issuer.token(sub="bob", groups=["language"])
        assert c.get(f"/v1/jobs/{job.json()['id']}", headers=_as(bob)).status_code == 404
        r = c.get("/v1/jobs", headers=_as(issuer.token(aud="grafana")))
        assert r.status_code == 401 and "aud" in r.json()["detail"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = c.get("/v1/jobs", headers=_as(issuer.token(groups=["marketing"])))
        assert r.status_code == 403 and "marketing" in r.json()["detail"]
        r = c.get("/v1/jobs", headers=_as(issuer.unsigned_token(groups=["isthmus-admins"])))
        assert r.status_code == 401
        # the admin group sees every team; static tokens still work beside OIDC
        admin = issuer.token(sub="ops", groups=["isthmus-admins"])
        assert c.get("/v1/admin/pools", headers=_as(admin)).status_code == 200
        assert len(c.get("/v1/jobs", headers=_as(ROOT_TOKEN)).json()["items"]) == 1


@pytest.fixture
def live_url(db: Database, config: IsthmusConfig) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(create_app(config, db), host="127.0.0.1", port=0, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 60, "the server to start",
               interval=0.05)
    assert server.started, "the server thread ended before it started"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_cli_sends_an_oidc_token_from_isthmus_token(
    live_url: str, issuer: LocalIssuer
) -> None:
    env = {**os.environ, "ISTHMUS_URL": live_url,
           "ISTHMUS_TOKEN": issuer.token(sub="alice", groups=["vision"])}
    out = subprocess.run([sys.executable, "-m", "broker.cli.main", "list", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["items"] == []
    env["ISTHMUS_TOKEN"] = issuer.token(sub="alice", exp=1_000_000)
    out = subprocess.run([sys.executable, "-m", "broker.cli.main", "list"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "expired" in out.stdout + out.stderr
