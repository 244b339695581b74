"""Wake-ups between replicas over PostgreSQL LISTEN/NOTIFY.

A submit answered by a replica that does not lead the control loop (a standby, or one of
`isthmus server --workers N`'s workers) must wake the leader's admission cycle, as a submit to
the leader does: before this, its job waited for the next admission interval. The replica that
committed the jobs sends `NOTIFY isthmus_admission` (`Notifier`, at most one per `gap` seconds,
from its own thread so that the API's event loop never waits on it); every replica listens on
its own connection (`Listener`) and hands each notification to its runtime, whose wake is a
no-op unless it leads. SQLite has one process and no such channel: both are PostgreSQL only.

Notifications are hints, never the only path: a lost one (a listener reconnecting, a notify
that failed) costs at most one admission interval, which is what every job waited before.
Failures are logged without the connection string (it may hold a password).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.conninfo import make_conninfo

from broker.logs import get_logger
from broker.store.db import Database

log = get_logger(__name__)

ADMISSION = "isthmus_admission"
RECONNECT_S = (0.5, 1.0, 2.0, 5.0)
"""Pauses before a lost listener connects again (the last one repeats)."""
PING_S = 30.0
"""How often a listener checks its connection with a ping to itself (see Listener)."""
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3, "tcp_user_timeout": 60_000}
"""libpq's TCP keepalives for the listening connection, which is idle between notifications."""


def supported(db: Database) -> bool:
    return db.dialect == "postgresql"


class Notifier:
    """Sends NOTIFY on `channel` after `poke()`, from a daemon thread started on the first
    poke: pokes closer than `gap` seconds are merged into one notification."""

    def __init__(self, db: Database, channel: str = ADMISSION, gap: float = 0.25) -> None:
        self.db, self.channel, self.gap = db, channel, gap
        self.sent = 0
        self._poked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def poke(self) -> None:
        """Ask for a notification soon; never blocks, never raises."""
        self._poked.set()
        if self._thread is None:
            with self._start:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name=f"notify-{self.channel}")
                    self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poked.wait()
            if self._stop.is_set():
                return
            self._poked.clear()
            try:
                with self.db.writer.connect() as conn:
                    conn.execute(sa.select(sa.func.pg_notify(self.channel, "")))
                    conn.commit()
                self.sent += 1
            except Exception as exc:  # a hint only: the leader's interval still comes round
                log.warning("NOTIFY %s failed (%s); the leader admits at its interval",
                            self.channel, type(exc).__name__)
            self._stop.wait(self.gap)


class Listener:
    """Calls `on_notify` (in its own daemon thread) for every notification on `channel`, on a
    connection of its own, connecting again after any failure.

    A connection can also die without an error (a NAT or load balancer dropping it while idle,
    a failover without a reset): TCP keepalives find some of those; for the rest the listener
    sends itself a ping on a channel of its own every `ping_s` seconds, through the database's
    pool, and connects again when one has not come back within `ping_s` more. After connecting
    again it calls `on_notify` once: what was sent while it was away is not lost."""

    def __init__(self, db: Database, on_notify: Callable[[], None],
                 channel: str = ADMISSION, ping_s: float = PING_S,
                 conninfo: str | None = None) -> None:
        self.db, self.on_notify, self.channel, self.ping_s = db, on_notify, channel, ping_s
        self.received = 0
        self.connects = 0  # LISTENs that took effect (more than one: it came back)
        self.listening = threading.Event()  # set while LISTEN is in effect
        self._conninfo = conninfo or _conninfo(db)
        self._ping = f"isthmus_ping_{uuid.uuid4().hex[:12]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"listen-{channel}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._listen()
                failures = 0
            except Exception as exc:
                self.listening.clear()
                pause = RECONNECT_S[min(failures, len(RECONNECT_S) - 1)]
                failures += 1
                log.warning("LISTEN %s lost (%s); connecting again in %.1f s", self.channel,
                            type(exc).__name__, pause)
                self._stop.wait(pause)

    def _listen(self) -> None:
        info = make_conninfo(self._conninfo, connect_timeout=10, **KEEPALIVES)
        with psycopg.connect(info, autocommit=True) as conn:
            for channel in (self.channel, self._ping):
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.connects += 1
            self.listening.set()
            if self.connects > 1:
                self._woken()  # what was notified while this listener was away
            sent, awaiting = time.monotonic(), True
            self._send_ping()
            while not self._stop.is_set():
                for n in conn.notifies(timeout=0.5):  # and so stop() waits at most that long
                    if n.channel == self._ping:
                        awaiting = False
                        continue
                    self.received += 1
                    self._woken()
                    if self._stop.is_set():
                        break
                waited = time.monotonic() - sent
                if awaiting and waited > self.ping_s:
                    raise TimeoutError(f"no ping back in {self.ping_s:.0f} s")
                if not awaiting and waited >= self.ping_s:
                    sent, awaiting = time.monotonic(), True
                    self._send_ping()
        self.listening.clear()

    def _woken(self) -> None:
        try:
            self.on_notify()
        except Exception:  # the runtime's wake: never ends the listener
            log.exception("wake on %s failed", self.channel)

    def _send_ping(self) -> None:
        try:
            with self.db.writer.connect() as conn:
                conn.execute(sa.select(sa.func.pg_notify(self._ping, "")))
                conn.commit()
        except Exception as exc:  # the database is away: the missing ping reconnects later
            log.warning("ping on %s failed (%s)", self._ping, type(exc).__name__)


def _conninfo(db: Database) -> str:
    return db.writer.url.set(drivername="postgresql").render_as_string(hide_password=False)
