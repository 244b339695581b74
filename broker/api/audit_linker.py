"""The API process's audit linker: it moves staged audit records to the chain's end
(broker/store/audit_log.py `stage`, `link`), in a worker thread, off the path of any request.

A commit that staged records pokes it (`poke`). The first poke schedules a linking pass,
which starts GATHER_S later: the records of the calls that commit meanwhile are linked by that
one pass (one chain lock, one commit) instead of one pass each; a poke during a pass schedules
the next. A pass links every staged record, whoever staged it, so the records of a process
that died between its commit and its linking are linked by the next pass of any replica,
and by the pass each process runs when it starts (`start`). A failed pass (the database
unreachable) is logged and tried again RETRY_S later, then at twice that, up to RETRIES
times (about a minute in all); after that the next poke, reader or start links them. The
records stay staged and committed meanwhile. `close` (the server's shutdown) waits for the
pass in flight and links what is left. The worker is a daemon thread, so an exit without
`close` does not wait for it; between passes it waits for work, it does not poll.
"""

from __future__ import annotations

import queue
import threading

from broker.logs import get_logger
from broker.store import audit_log
from broker.store.db import Database

log = get_logger(__name__)

GATHER_S = 0.5
"""How long a scheduled pass lets records gather before it links them. Readers of the log link
what is staged first, so it delays no answer; the longer it is, the fewer passes (each takes
the chain's lock, reads its tail and commits: at 0.05 s, 20 passes a second of ~4 records each
cost a replica 7% of its CPU under the soak)."""
RETRY_S = 2.0
"""How long after a failed pass the next one starts (doubling with each failure)."""
RETRIES = 5
"""Passes tried again after failures in a row, at most: the linker of a process whose
database is gone does not try for ever."""


class AuditLinker:
    def __init__(self, db: Database, gather_s: float = GATHER_S,
                 retry_s: float = RETRY_S) -> None:
        self.db = db
        self.gather_s, self.retry_s = gather_s, retry_s
        self._lock = threading.Lock()
        self._scheduled = False
        self._failures = 0  # failed passes in a row
        self._closed = threading.Event()
        self._passes: queue.SimpleQueue[float | None] = queue.SimpleQueue()  # their delays
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """A pass now: what a process that died left staged."""
        self._schedule(0.0)

    def poke(self) -> None:
        """Records were staged and committed: a pass soon, if none is scheduled. Never
        raises: the caller's requests are answered whatever becomes of the pass."""
        self._schedule(self.gather_s)

    def _schedule(self, delay: float) -> None:
        try:
            with self._lock:
                if self._scheduled or self._closed.is_set():
                    return
                if self._worker is None:
                    # a daemon: the interpreter's exit does not wait out a pass's delay (a
                    # pass cut off rolls back; its records stay staged for the next)
                    self._worker = threading.Thread(target=self._work, daemon=True,
                                                    name="isthmus-audit-link")
                    self._worker.start()
                self._passes.put(delay)
                self._scheduled = True
        except Exception:  # no thread to be had: the next poke, a reader or a start links
            log.exception("audit linking pass not scheduled")

    def _work(self) -> None:
        while (delay := self._passes.get()) is not None:
            self._pass(delay)

    def _pass(self, delay: float) -> None:
        if delay:
            self._closed.wait(delay)  # cut short by close, which links what is left
        with self._lock:
            self._scheduled = False  # a poke from now on is for records this pass may miss
        try:
            audit_log.link_staged(self.db)
        except Exception as exc:  # they stay staged and committed: a pass again, later
            self._failures += 1
            if self._failures > RETRIES:
                self._failures = 0
                log.exception("staged audit records not linked to the chain; left for the "
                              "next call, read of the log or start")
                return
            delay = self.retry_s * 2 ** (self._failures - 1)
            log.warning("staged audit records not linked to the chain yet (%s); again in "
                        "%.0f s", type(exc).__name__, delay)
            self._schedule(delay)
        else:
            self._failures = 0

    def close(self) -> None:
        """The pass in flight finished, then every staged record linked."""
        self._closed.set()
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._passes.put(None)
            worker.join(timeout=60)
        try:
            audit_log.link_staged(self.db)
        except Exception:
            log.exception("staged audit records left for the next server to link")
