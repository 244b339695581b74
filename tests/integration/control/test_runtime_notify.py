"""A submit answered by a replica that does not lead wakes the leader's admission cycle
(PostgreSQL NOTIFY, broker.store.notify): before, its job waited for the next admission
interval (here 10 minutes)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.store.db import Database
from broker.store.notify import Listener, Notifier
from broker.store.queries import get_job
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.runtime import QUICK_S, idle, slow_runtime
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
        app = create_app(sim.plane.config, sim.plane.db, None)
        client = TestClient(app)
        body = spec().flavors("h100-80g").build().model_dump(mode="json", exclude_none=True)
        answer = client.post("/v1/jobs", json=body)
        assert answer.status_code == 201, answer.text
        job = answer.json()["id"]
        # the poll gives up long before the admission interval (QUICK_S < SLOW.admission)
        wait_until(lambda: _state(sim.plane.db, job) != "QUEUED"
                   and _state(sim.plane.db, job) != "SUBMITTED", QUICK_S,
                   "the other replica's submit to wake the leader's admission", interval=0.05)
        assert leader._cycles["admission"] > passes
        assert leader._listener is not None and leader._listener.received >= 1
        notifier = app.state.wake_admission.notifier
        assert notifier._thread is not None and notifier._thread.is_alive()
        with TestClient(app):  # the app's shutdown stops the notifier's thread
            pass
        assert not notifier._thread.is_alive()
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


class _Proxy:
    """A TCP relay to PostgreSQL that can black-hole the connections it relays so far (read
    and drop everything, never close): a NAT or load balancer that forgot them."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.dead: set[int] = set()
        self.serial = 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen()
        self.port = int(self.srv.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def black_hole(self) -> None:
        self.dead |= set(range(self.serial + 1))

    def _accept(self) -> None:
        while True:
            c, _ = self.srv.accept()
            self.serial += 1
            u = socket.create_connection(self.target)
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b, self.serial),
                                 daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, serial: int) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                if serial not in self.dead:
                    b.sendall(data)


def test_a_listener_whose_connection_went_silent_connects_again_and_catches_up(
    db: Database,
) -> None:
    url = db.writer.url.set(drivername="postgresql")
    proxy = _Proxy(str(url.host), int(url.port or 5432))
    heard: list[float] = []
    listener = Listener(db, lambda: heard.append(time.monotonic()), ping_s=1.0,
                        conninfo=url.set(host="127.0.0.1", port=proxy.port)
                        .render_as_string(hide_password=False))
    notifier = Notifier(db, gap=0.1)
    listener.start()
    try:
        wait_until(listener.listening.is_set, 30, "LISTEN through the relay")
        notifier.poke()
        wait_until(lambda: len(heard) >= 1, 30, "the first notification")
        proxy.black_hole()  # no error, no close: the connection only goes silent
        before = len(heard)
        notifier.poke()  # sent while the listener cannot hear it
        wait_until(lambda: listener.connects >= 2, 60, "the missing ping to reconnect it")
        wait_until(lambda: len(heard) > before, 30, "the catch-up wake after reconnecting")
    finally:
        notifier.stop()
        listener.stop()
