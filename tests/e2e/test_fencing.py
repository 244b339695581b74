"""Fencing with two real server processes on one PostgreSQL database: the leader stops (SIGSTOP)
in the middle of an admission cycle, the standby takes over after the lease expires, the old
leader is resumed (SIGCONT) and finishes its cycle: its write is refused, nothing of its old
epoch lands after the hand-over, and it steps down."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.store.db import normalise_url
from tests.harness.server import Server, write_config
from tests.harness.wait import wait_until


def _stopped(server: Server) -> bool:
    assert server.proc is not None
    stat = Path(f"/proc/{server.proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.postgres
def test_a_paused_leader_writes_nothing_after_the_handover(
    tmp_path: Path, pg_server: object, pg_template: str
) -> None:
    db_url = pg_server.url(pg_server.new_database(pg_template))  # type: ignore[attr-defined]
    engine = sa.create_engine(normalise_url(db_url))

    def cycles(epoch: int) -> int:
        """Cycles recorded under `epoch`: a row each, plus the idle ones counted on a row."""
        with engine.connect() as conn:
            return int(conn.execute(
                sa.text("SELECT coalesce(sum(1 + repeats), 0) FROM admission_cycles "
                        "WHERE leader_epoch = :e"),
                {"e": epoch},
            ).scalar() or 0)

    cfg = write_config(tmp_path / "isthmus.yaml", backends=[], pools=[])
    # the leader stops itself in its 40th admission cycle (about 20 s after it starts leading,
    # time for the standby to start), decided but not yet recorded
    a = Server(cfg, db_url, tmp_path / "a.log", env={"ISTHMUS_STOP_AT": "before-cycle-record:40"})
    a.start()
    health = wait_until(lambda: (h := a.healthy()) and h.get("control") == "leader" and h, 15,
                        "a to lead")
    old = health["epoch"]
    b = Server(cfg, db_url, tmp_path / "b.log").start()
    try:
        assert (b.healthy() or {}).get("control") == "standby", "a stopped before b started"
        wait_until(lambda: _stopped(a), 60, "the leader to stop in its admission cycle")
        health = wait_until(
            lambda: (h := b.healthy()) and h["control"] == "leader" and h, 30,
            "the standby to take over",
        )
        assert health["epoch"] == old + 1
        landed = cycles(old)
        wait_until(lambda: cycles(old + 1) > 0, 15, "the new leader's first cycle")

        assert a.proc is not None
        a.proc.send_signal(signal.SIGCONT)  # the old leader carries on where it stopped
        wait_until(lambda: "fenced: write of epoch" in a.log.read_text(), 30,
                   "the old leader's write to be refused")
        wait_until(lambda: (a.healthy() or {}).get("control") == "standby", 15,
                   "the old leader to step down")
        assert cycles(old) == landed  # none of its writes landed after the hand-over
        log = a.log.read_text()
        assert f"write of epoch {old} refused: the lease is at epoch {old + 1}" in log
        assert "stepping down" in log
        # the new leader goes on recording cycles under its own epoch
        after = cycles(old + 1)
        wait_until(lambda: cycles(old + 1) > after, 15, "the new leader to go on")
        assert cycles(old) == landed
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        a.kill()
        b.kill()
        engine.dispose()
