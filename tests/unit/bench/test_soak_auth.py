"""The soak runs as production does: every call authenticated, each team with its own token
(bench/soak.py `TOKENS`), and the load calls as the team whose job it is. Its client was the
open API's local admin, so each of its reads of a team's jobs was an admin's read, recorded in
the audit log (a write for every read), which no team's user costs."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from bench.soak import TEAMS, Answer, Load, Stats, as_team, spec, write_config
from broker.api.app import create_app
from broker.config import load_config
from broker.store import open_database


def test_the_soak_servers_authenticate_each_team_by_its_own_token(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, 100, tmp_path / "outage"))
    db = open_database(f"sqlite:///{tmp_path}/auth.db")
    try:
        with TestClient(create_app(config, db)) as client:
            body = spec("soak-0000001", "vision", random.Random(1))
            assert client.post("/v1/jobs", json=body).status_code == 401
            made = client.post("/v1/jobs", json=body,
                               headers={"Idempotency-Key": "soak-0000001", **as_team("vision")})
            assert made.status_code == 201, made.text
            job = made.json()["id"]
            assert client.get(f"/v1/jobs/{job}", headers=as_team("vision")).status_code == 200
            assert client.get(f"/v1/jobs/{job}/explain",
                              headers=as_team("vision")).status_code == 200
            # another team's token does not see it (team scoping, as for any user)
            assert client.get(f"/v1/jobs/{job}", headers=as_team("speech")).status_code == 404
        with db.read() as s:
            actions = [(r[0], r[1]) for r in s.connection().execute(text(
                "SELECT action, outcome FROM audit_log UNION ALL "
                "SELECT action, outcome FROM audit_staged"))]
    finally:
        db.dispose()
    # the submit is recorded; a team's reads of its own job are not (an admin's were)
    assert ("job.submit", "allowed") in actions
    assert not [a for a, _ in actions if a.startswith("read")], actions


class _Rng:
    """Every draw takes the branch asked: a cancel after each submit, then each read kind."""

    def __init__(self, draws: list[float]) -> None:
        self.draws = draws

    def random(self) -> float:
        return self.draws.pop(0)

    def uniform(self, a: float, b: float) -> float:
        return 0.0

    def choice(self, seq: Any) -> Any:
        return seq[-1]


def test_the_load_calls_as_the_team_whose_job_it_is() -> None:
    load = Load([SimpleNamespace(name="a", port=1, role="api")], 0.0, Stats(), 1)  # type: ignore[list-item]
    load.make_spec = lambda name, team, rng: {"name": name, "team": team}
    calls: list[tuple[str, str, str | None]] = []

    async def call(method: str, path: str, due: float, body: Any = None,
                   headers: dict[str, str] | None = None) -> Answer:
        calls.append((method, path, (headers or {}).get("Authorization")))
        return Answer(201, b'{"id": "job-%d"}' % len(calls))

    load.call = call  # type: ignore[method-assign]
    load.rng = _Rng([0.05, 0.05, 0.15, 0.25])  # type: ignore[assignment]

    async def run() -> None:
        await load.submit(1, 0.0)  # TEAMS[1]'s job, then its cancel
        await load.read(2, 0.0)  # TEAMS[2]'s list
        await load.read(3, 0.0)  # an explain of the last job (TEAMS[1]'s)
        await load.read(3, 0.0)  # a read of it

    asyncio.run(run())
    bearer = {t: as_team(t)["Authorization"] for t in TEAMS}
    assert calls == [
        ("POST", "/v1/jobs", bearer[TEAMS[1]]),
        ("POST", "/v1/jobs/job-1/cancel", bearer[TEAMS[1]]),
        ("GET", f"/v1/jobs?team={TEAMS[2]}&limit=50", bearer[TEAMS[2]]),
        ("GET", "/v1/jobs/job-1/explain", bearer[TEAMS[1]]),
        ("GET", "/v1/jobs/job-1", bearer[TEAMS[1]]),
    ]
    assert len(set(bearer.values())) == len(TEAMS)
