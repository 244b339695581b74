"""A submit answered by a replica that does not lead wakes the leader's admission cycle
(PostgreSQL NOTIFY, broker.store.notify): before, its job waited for the next admission
interval (here 10 minutes)."""

from __future__ import annotations

import time

import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.store.db import Database
from broker.store.notify import Listener, Notifier
from broker.store.queries import get_job
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.runtime import QUICK_S, SLOW, idle, slow_runtime
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

pytestmark = POSTGRES_ONLY  # one process on SQLite: nothing to notify


def _state(db: Database, job_id: str) -> str:
    with db.read() as s:
        job = get_job(s, job_id)
        return job.state if job is not None else "missing"


def test_a_submit_to_a_replica_that_does_not_lead_wakes_the_leaders_admission(
    threaded_sim: Sim,
) -> None:
    sim = threaded_sim
    leader = slow_runtime(sim)
    leader.start()
    try:
        wait_until(lambda: idle(leader, "admission") and leader._listener is not None
                   and leader._listener.listening.is_set(), 60,
                   "the first admission pass and the leader's LISTEN")
        passes = leader._cycles["admission"]
        # another replica's API: the same database, no control loop of its own
        client = TestClient(create_app(sim.plane.config, sim.plane.db, None))
        body = spec().flavors("h100-80g").build().model_dump(mode="json", exclude_none=True)
        t0 = time.monotonic()
        answer = client.post("/v1/jobs", json=body)
        assert answer.status_code == 201, answer.text
        job = answer.json()["id"]
        wait_until(lambda: _state(sim.plane.db, job) != "QUEUED"
                   and _state(sim.plane.db, job) != "SUBMITTED", QUICK_S,
                   "the other replica's submit to wake the leader's admission", interval=0.05)
        assert time.monotonic() - t0 < QUICK_S < SLOW.admission
        assert leader._cycles["admission"] > passes
        assert leader._listener is not None and leader._listener.received >= 1
    finally:
        leader.stop()


def test_pokes_are_merged_and_a_listener_comes_back_after_its_connection_dies(
    db: Database,
) -> None:
    heard: list[float] = []
    listener = Listener(db, lambda: heard.append(time.monotonic()))
    notifier = Notifier(db, gap=0.3)
    listener.start()
    try:
        wait_until(listener.listening.is_set, 30, "LISTEN")
        for _ in range(50):  # a burst of commits: one notification, then one per gap at most
            notifier.poke()
        wait_until(lambda: len(heard) >= 1, 30, "the first notification")
        assert notifier.sent <= 2 and len(heard) <= 2

        with db.write() as s:  # the listener's connection is killed by the server
            s.connection().execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN%' AND datname = current_database()"))
        wait_until(lambda: listener.connects >= 2, 30, "LISTEN again on a new connection")
        before = len(heard)
        notifier.poke()
        wait_until(lambda: len(heard) > before, 30, "a notification after the reconnect")
    finally:
        notifier.stop()
        listener.stop()
