"""Group commit for submissions: requests that arrive while a commit is in flight share the
next transaction, so durable submits cost one fsync per batch instead of one each.

A request still gets its answer only after its own job is committed; a failure of one
submission (idempotency conflict) is reported to that request alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.config import IsthmusConfig
from broker.orchestration.submission import Submission, Submitted, submit_many
from broker.store.db import Database


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
                try:
                    # Inline on purpose: a worker thread would fight the event loop for the
                    # GIL on every statement. While this runs, new requests wait in socket
                    # buffers; they form the next batch.
                    results = submit_many(self.db, self.config, [s for s, _ in batch])
                except Exception as exc:  # the transaction failed as a whole
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
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
