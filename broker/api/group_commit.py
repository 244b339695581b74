"""Group commit for submissions: requests that arrive while a commit is in flight share the
next transaction, so durable submits cost one fsync per batch instead of one each.

A batch's statements and its COMMIT (which waits for the disk, and on SQLite may run a WAL
checkpoint) run in one worker thread, so the loop keeps reading, validating and answering
other requests meanwhile: each statement is a round trip the database may be slow to answer
on a busy machine, and on the loop every request of the replica waited for them (the soak's
tail, 100 submits/s). Requests that arrive meanwhile make the next batch.

A request still gets its answer only after its own job is committed; a failure of one
submission (an idempotency conflict, a row the database refuses, a failed commit) is reported
to that request alone.

The audit records of a batch's stored submissions (broker/api/audit_trail.py `InCommit`) are
staged last in its transaction (one insert, no lock; the process's audit linker links them to
the chain after the commit), so the hot path pays no transaction of its own for them;
a request the batch did not store (a conflict, the savepoint path) is recorded by the audit
middleware as any other call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker.api.audit_trail import InCommit
from broker.config import IsthmusConfig
from broker.logs import get_logger
from broker.orchestration.submission import (
    IdempotencyConflict,
    Submission,
    Submitted,
    _submit_in,
    known_keys,
    submit_many,
)
from broker.store import audit_log, batch
from broker.store.db import Database

log = get_logger(__name__)


class _Unbatched(Exception):
    """The batch's statements failed (its cause), before its commit."""


class SubmitQueue:
    def __init__(
        self, db: Database, config: IsthmusConfig, max_batch: int = 128,
        on_commit: Callable[[], None] | None = None,
        on_staged: Callable[[], None] | None = None,
    ) -> None:
        self.on_commit = on_commit
        self.on_staged = on_staged  # audit records were committed (the audit linker)
        self.db = db
        self.config = config
        self.max_batch = max_batch
        self._pending: list[tuple[Submission, InCommit | None, asyncio.Future[Submitted]]] = []
        self._draining = False
        self._committer: ThreadPoolExecutor | None = None

    async def submit(self, sub: Submission, audit: InCommit | None = None) -> Submitted:
        """`sub` stored (with `audit`'s record, when the batch stores it)."""
        fut: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._pending.append((sub, audit, fut))
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
                results = await self._store([(s, a) for s, a, _ in batch])
                if self.on_commit is not None:
                    self.on_commit()  # wake the admission cycle: new jobs are queued
                for (_, _, fut), result in zip(batch, results, strict=True):
                    if fut.done():
                        continue  # the client went away
                    if isinstance(result, Exception):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            self._draining = False

    async def _store(self, audited: list[tuple[Submission, InCommit | None]]
                     ) -> list[Submitted | Exception]:
        """The batch written with one statement per table (`_batched`), its audit records
        staged, and committed, all in the worker thread (`_written`); if either fails,
        `_commit` (the rare path, in that thread too), which leaves the records to the
        middleware."""
        subs = [s for s, _ in audited]
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="isthmus-commit")
        loop = asyncio.get_running_loop()
        try:
            out, held = await loop.run_in_executor(
                self._committer, self._written, subs, [a for _, a in audited])
        except _Unbatched as exc:
            log.info("a batch of %d submissions failed as one (%r); with savepoints now",
                     len(subs), exc.__cause__)
            return await loop.run_in_executor(self._committer, self._commit, subs)
        except Exception as exc:
            log.warning("the commit of a batch of %d submissions failed (%r); again with "
                        "savepoints", len(subs), exc)
            return await loop.run_in_executor(self._committer, self._commit, subs)
        held.run_effects()  # the transition metrics, once the batch is committed
        staged = False
        for (_, audit), result in zip(audited, out, strict=True):
            if audit is not None and not isinstance(result, Exception):
                audit.written()
                staged = True
        if staged and self.on_staged is not None:
            self.on_staged()
        return out

    def _written(self, subs: list[Submission], audits: list[InCommit | None]
                 ) -> tuple[list[Submitted | Exception], batch.Deferred]:
        """`_batched` and its commit, in the worker thread: the loop goes on reading and
        answering requests through the batch's round trips, not only through its COMMIT."""
        try:
            tx, out, held = self._batched(subs, audits)
        except Exception as exc:
            raise _Unbatched from exc
        tx.close()
        return out, held

    def _commit(self, subs: list[Submission]) -> list[Submitted | Exception]:
        """The batch again after its batched write failed, in one transaction through
        submit_many, which isolates each submission in a savepoint. Should that transaction
        fail as a whole too (the commit or the connection failed), each submission is retried
        alone: a failure is then reported to the request that caused it, and the others are
        stored."""
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

    def _batched(
        self, subs: list[Submission], audits: list[InCommit | None] | None = None,
    ) -> tuple[contextlib.ExitStack, list[Submitted | Exception], batch.Deferred]:
        """The batch's rows queued and written with one executemany per statement
        (broker.store.batch), in a transaction left open: closing the returned stack commits
        it (or rolls it back and raises); the returned effects (the transition metrics) are
        run by the caller once that commit succeeded, so a batch whose commit fails and is
        done again counts each submission once. An idempotency conflict is that request's answer
        (nothing of it was queued); anything else, in Python or at the flush (a key reused
        within the batch, a row the database refuses), rolls the whole batch back and raises,
        and `_commit` then does it again with a savepoint per submission."""
        out: list[Submitted | Exception] = []
        with contextlib.ExitStack() as tx:
            s = tx.enter_context(self.db.write())
            known = known_keys(s, subs)  # one look-up for the batch's keys
            with batch.deferred(s, effects=False) as queued:
                for sub in subs:
                    mark = queued.mark()
                    try:
                        out.append(_submit_in(s, self.config, sub, known))
                    except IdempotencyConflict as exc:
                        queued.cut(mark)
                        out.append(exc)
            # staged when the stack closes, in the committer thread just before COMMIT (its
            # round trip does not hold up the event loop); the audit linker chains them
            tx.callback(audit_log.stage, s, [
                a.filled(201 if r.created else 200, f"job:{r.job.id}")
                for a, r in zip(audits or [None] * len(subs), out, strict=True)
                if a is not None and not isinstance(r, Exception)])
            return tx.pop_all(), out, queued
