"""The API process's audit linker: it moves staged audit records to the chain's end
(broker/store/audit_log.py `stage`, `link`), in a worker thread, off the path of any request.

A commit that staged records pokes it (`poke`). The first poke schedules a linking pass,
which starts GATHER_S later: the records of the calls that commit meanwhile are linked by that
one pass (one chain lock, one commit) instead of one pass each; a poke during a pass schedules
the next. A pass links every staged record, whoever staged it, so the records of a process
that died between its commit and its linking are linked by the next pass of any replica,
and by the pass each process runs when it starts (`start`). A failed pass is logged; the
records stay staged and committed for the next. `close` (the server's shutdown) waits for
the pass in flight and links what is left. No thread polls: between passes the worker waits
for work.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from broker.logs import get_logger
from broker.store import audit_log
from broker.store.db import Database

log = get_logger(__name__)

GATHER_S = 0.05
"""How long a scheduled pass lets records gather before it links them."""


class AuditLinker:
    def __init__(self, db: Database, gather_s: float = GATHER_S) -> None:
        self.db = db
        self.gather_s = gather_s
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = threading.Event()
        self._worker: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """A pass now: what a process that died left staged."""
        self._schedule(gather=False)

    def poke(self) -> None:
        """Records were staged and committed: a pass soon, if none is scheduled."""
        self._schedule(gather=True)

    def _schedule(self, gather: bool) -> None:
        with self._lock:
            if self._scheduled or self._closed.is_set():
                return
            self._scheduled = True
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="isthmus-audit-link")
            self._worker.submit(self._pass, gather)

    def _pass(self, gather: bool) -> None:
        if gather:
            self._closed.wait(self.gather_s)  # cut short by close, which links what is left
        with self._lock:
            self._scheduled = False  # a poke from now on is for records this pass may miss
        try:
            audit_log.link_staged(self.db)
        except Exception:  # they stay staged and committed: the next pass links them
            log.exception("staged audit records not linked to the chain yet")

    def close(self) -> None:
        """The pass in flight finished, then every staged record linked."""
        self._closed.set()
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)
        try:
            audit_log.link_staged(self.db)
        except Exception:
            log.exception("staged audit records left for the next server to link")
