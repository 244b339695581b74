"""Group commit for submissions: requests that arrive while a commit is in flight share the
next transaction, so durable submits cost one fsync per batch instead of one each.

A request still gets its answer only after its own job is committed; a failure of one
submission (an idempotency conflict, a row the database refuses, a failed commit) is reported
to that request alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.config import IsthmusConfig
from broker.logs import get_logger
from broker.orchestration.submission import (
    IdempotencyConflict,
    Submission,
    Submitted,
    _submit_in,
    submit_many,
)
from broker.store import batch
from broker.store.db import Database

log = get_logger(__name__)


class SubmitQueue:
    def __init__(
        self, db: Database, config: IsthmusConfig, max_batch: int = 128,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.on_commit = on_commit
        self.db = db
        self.config = config
        self.max_batch = max_batch
        self._pending: list[tuple[Submission, asyncio.Future[Submitted]]] = []
        self._draining = False

    async def submit(self, sub: Submission) -> Submitted:
        fut: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._pending.append((sub, fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let requests that are already readable join this batch
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                # Inline on purpose: a worker thread would fight the event loop for the GIL on
                # every statement. While this runs, new requests wait in socket buffers; they
                # form the next batch.
                results = self._commit([s for s, _ in batch])
                if self.on_commit is not None:
                    self.on_commit()  # wake the admission cycle: new jobs are queued
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():
                        continue  # the client went away
                    if isinstance(result, Exception):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            self._draining = False

    def _commit(self, subs: list[Submission]) -> list[Submitted | Exception]:
        """One transaction for the batch, its rows sent as one statement per table
        (`_batched`); if that fails, submit_many, which isolates each submission in a
        savepoint. Should that transaction fail as a whole too (the commit or the connection
        failed), each submission is retried alone: a failure is then reported to the request
        that caused it, and the others are stored."""
        if len(subs) > 1:
            try:
                return self._batched(subs)
            except Exception as exc:
                log.info("a batch of %d submissions failed as one (%r); with savepoints now",
                         len(subs), exc)
        try:
            return submit_many(self.db, self.config, subs)
        except Exception as exc:
            if len(subs) == 1:
                return [exc]
            log.warning("a batch of %d submissions failed (%r); retrying one by one",
                        len(subs), exc)
        out: list[Submitted | Exception] = []
        for sub in subs:
            try:
                out += submit_many(self.db, self.config, [sub])
            except Exception as exc:
                out.append(exc)
        return out

    def _batched(self, subs: list[Submission]) -> list[Submitted | Exception]:
        """The batch's rows queued and written with one executemany per statement
        (broker.store.batch). An idempotency conflict is that request's answer (nothing of it
        was queued); anything else, in Python or at the flush (a key reused within the batch,
        a row the database refuses), fails the whole batch, which `_commit` then does again
        with a savepoint per submission."""
        out: list[Submitted | Exception] = []
        with self.db.write() as s, batch.deferred(s) as queued:
            for sub in subs:
                mark = queued.mark()
                try:
                    out.append(_submit_in(s, self.config, sub))
                except IdempotencyConflict as exc:
                    queued.cut(mark)
                    out.append(exc)
        return out
