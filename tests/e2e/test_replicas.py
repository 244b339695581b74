"""Two server replicas on one PostgreSQL database: exactly one leads; killing it hands over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.server import Server, job_spec, write_config
from tests.harness.wait import wait_until


@pytest.mark.postgres
def test_one_leader_and_handover_after_kill(tmp_path: Path, pg_server: object,
                                           pg_template: str) -> None:
    db_url = pg_server.url(pg_server.new_database(pg_template))  # type: ignore[attr-defined]
    cfg = write_config(tmp_path / "isthmus.yaml", backends=[], pools=[])
    a = Server(cfg, db_url, tmp_path / "a.log").start()
    b = Server(cfg, db_url, tmp_path / "b.log").start()
    try:
        def roles() -> list[str]:
            return sorted(str((s.healthy() or {}).get("control")) for s in (a, b))

        wait_until(lambda: roles() == ["leader", "standby"], 15, "one leader, one standby")
        leader, standby = (a, b) if (a.healthy() or {})["control"] == "leader" else (b, a)
        epoch = (leader.healthy() or {})["epoch"]
        # every replica serves the API
        job = standby.submit(job_spec("through-standby", "a100-80g"))
        assert leader.job(job["id"])["state"] in ("QUEUED", "REJECTED")
        leader.kill()  # kill -9: no clean release; the lease must expire
        health = wait_until(
            lambda: (h := standby.healthy()) and h["control"] == "leader" and h, 20,
            "the standby to take over",
        )
        assert health["epoch"] == epoch + 1
    finally:
        a.kill()
        b.kill()
