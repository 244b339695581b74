"""Group commit of submissions: one transaction, one failure does not sink the others."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import event

from broker.api.group_commit import SubmitQueue
from broker.config import IsthmusConfig
from broker.orchestration.replay import check_all
from broker.orchestration.submission import (
    IdempotencyConflict,
    Submission,
    Submitted,
    submit_job,
    submit_many,
)
from broker.store import Database, records
from broker.store.queries import list_jobs
from tests.builders import spec


def gathered(
    db: Database, config: IsthmusConfig, subs: list[Submission]
) -> list[Submitted | BaseException]:
    """The submissions sent to one SubmitQueue at once (they share its batches)."""

    async def run() -> list[Submitted | BaseException]:
        queue = SubmitQueue(db, config)
        return await asyncio.gather(*(queue.submit(s) for s in subs), return_exceptions=True)

    return asyncio.run(run())


def test_batch_with_conflict_and_duplicate_keys(
    db: Database, example_config: IsthmusConfig
) -> None:
    first = submit_job(db, example_config, spec().build(), "a", "k0").job
    batch = [
        Submission(spec().name("one").build(), "a"),
        Submission(spec().name("other-body").build(), "a", "k0"),  # key reused, new body
        Submission(spec().name("two").build(), "a", "k1"),
        Submission(spec().name("two").build(), "a", "k1"),  # same key and body in one batch
        Submission(spec().replicas(50).build(), "a"),  # stored, then rejected
    ]
    results = submit_many(db, example_config, batch)
    assert isinstance(results[1], IdempotencyConflict) and results[1].job_id == first.id
    ok = [r for r in results if isinstance(r, Submitted)]
    assert [r.created for r in ok] == [True, True, False, True]
    assert ok[1].job.id == ok[2].job.id
    assert ok[3].job.state == "REJECTED"
    with db.read() as s:
        assert len(list_jobs(s, limit=100)) == 4
        assert list(check_all(s)) == []


def test_a_submission_failing_in_the_database_fails_alone(
    db: Database, example_config: IsthmusConfig
) -> None:
    """A NUL byte makes PostgreSQL refuse the row; elsewhere any unexpected error stands in.
    Validation refuses NUL at the door now; the group commit must not depend on that."""
    good = [Submission(spec().name(f"ok-{i}").build(), "a") for i in range(3)]
    poison = spec().name("poison").build().model_copy(update={"queue": "a\x00b"})
    results = submit_many(db, example_config, [good[0], Submission(poison, "b"), *good[1:]])
    assert all(isinstance(results[i], Submitted) for i in (0, 2, 3)), results
    with db.read() as s:
        names = {j.name for j in list_jobs(s, limit=100)}
        assert {"ok-0", "ok-1", "ok-2"} <= names
        assert list(check_all(s)) == []


def test_an_unexpected_error_in_one_submission_fails_alone(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = records.insert_new_job

    def insert(session: Any, job: Any) -> None:
        if job.name == "poison":
            raise ValueError("boom")
        real(session, job)

    monkeypatch.setattr(records, "insert_new_job", insert)
    before = _queued_count()
    batch = [Submission(spec().name(n).build(), "a") for n in ("one", "poison", "two")]
    results = submit_many(db, example_config, batch)
    assert isinstance(results[1], ValueError)
    # the metrics count what committed: the rolled-back savepoint's transitions are dropped
    assert _queued_count() - before == 2
    assert isinstance(results[0], Submitted) and isinstance(results[2], Submitted)
    with db.read() as s:
        assert {j.name for j in list_jobs(s, limit=100)} == {"one", "two"}
        assert list(check_all(s)) == []


def test_concurrent_submissions_in_one_batch_survive_a_poisoned_one(
    db: Database, example_config: IsthmusConfig
) -> None:
    """Two teams submit concurrently; one request's row cannot be stored. The others in the
    same group-commit batch are answered with their jobs, the bad one with its own error."""
    poison = spec().name("poison").build().model_copy(update={"queue": "a\x00b"})
    subs = [Submission(spec().name(f"v{i}").build(), "alice") for i in range(4)]
    subs += [Submission(spec().name(f"l{i}").team("language").build(), "bob") for i in range(4)]
    subs.insert(3, Submission(poison, "mallory"))

    results = gathered(db, example_config, subs)
    good = [r for i, r in enumerate(results) if i != 3]
    assert all(isinstance(r, Submitted) and r.created for r in good), results
    with db.read() as s:
        names = {j.name for j in list_jobs(s, limit=100)}
        assert names >= {f"v{i}" for i in range(4)} | {f"l{i}" for i in range(4)}
        assert list(check_all(s)) == []


def test_a_whole_batch_failure_is_retried_one_by_one(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the batch transaction itself fails, each submission is tried alone, so only the one
    that cannot be stored fails."""
    from broker.api import group_commit
    from broker.orchestration.submission import submit_many as real

    def flaky(db: Database, config: IsthmusConfig, subs: list[Submission]) -> Any:
        if any(s.spec.name == "poison" for s in subs):
            raise RuntimeError("commit failed")
        return real(db, config, subs)

    def unbatched(self: SubmitQueue, subs: list[Submission], *audits: Any) -> Any:
        raise RuntimeError("the batched statements failed")

    monkeypatch.setattr(group_commit, "submit_many", flaky)
    monkeypatch.setattr(SubmitQueue, "_batched", unbatched)
    subs = [Submission(spec().name(n).build(), "a") for n in ("one", "poison", "two")]

    results = gathered(db, example_config, subs)
    assert isinstance(results[1], RuntimeError)
    assert isinstance(results[0], Submitted) and isinstance(results[2], Submitted)


def test_a_group_commit_batch_is_written_batched_with_submit_manys_answers(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17: a group-commit batch is written with one statement per table for all its
    submissions; a key reused within the batch fails that write as a whole, and the batch is
    then done with a savepoint per submission, answering as submit_many does."""
    first = submit_job(db, example_config, spec().build(), "a", "k0").job
    outcomes: list[str] = []
    real = SubmitQueue._batched

    def spy(self: SubmitQueue, subs: list[Submission], *audits: Any) -> Any:
        try:
            out = real(self, subs, *audits)
        except Exception:
            outcomes.append("failed")
            raise
        outcomes.append("batched")
        return out

    monkeypatch.setattr(SubmitQueue, "_batched", spy)

    plain = gathered(
        db, example_config, [Submission(spec().name(f"p{i}").build(), "a") for i in range(5)])
    assert outcomes == ["batched"]
    assert all(isinstance(r, Submitted) and r.created for r in plain)
    mixed = gathered(db, example_config, [
        Submission(spec().name("one").build(), "a"),
        Submission(spec().name("other-body").build(), "a", "k0"),  # key reused, new body
        Submission(spec().name("two").build(), "a", "k1"),
        Submission(spec().name("two").build(), "a", "k1"),  # same key and body in one batch
    ])
    assert outcomes == ["batched", "failed"]
    assert isinstance(mixed[1], IdempotencyConflict) and mixed[1].job_id == first.id
    ok = [r for r in mixed if isinstance(r, Submitted)]
    assert [r.created for r in ok] == [True, True, False]
    assert ok[1].job.id == ok[2].job.id
    with db.read() as s:
        assert len(list_jobs(s, limit=100)) == 1 + 5 + 2
        assert list(check_all(s)) == []


def _held_submit(db: Database, config: IsthmusConfig, hook: str, holds: Any
                 ) -> tuple[Submitted, bool, list[bool]]:
    """One submission through a SubmitQueue while the engine's `hook` (an event of db.writer)
    holds the batch where `holds(*event args)` says, until the loop has seen the hold: the
    result, whether it was answered during the hold, and whether each hold was released
    (False: it timed out, the loop never ran meanwhile)."""
    held, released = threading.Event(), threading.Event()
    waited: list[bool] = []

    def hold(*args: Any) -> None:  # runs where the batch's work runs
        if holds(*args):
            held.set()
            waited.append(released.wait(timeout=10))

    async def run() -> tuple[Submitted, bool]:
        queue = SubmitQueue(db, config)
        task = asyncio.create_task(queue.submit(Submission(spec().name("held").build(), "a")))
        deadline = time.monotonic() + 30
        while not held.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the loop is free while the batch is held
        answered_early = task.done()
        released.set()
        return await task, answered_early

    event.listen(db.writer, hook, hold)
    try:
        result, answered_early = asyncio.run(run())
    finally:
        event.remove(db.writer, hook, hold)
    return result, answered_early, waited


def test_the_event_loop_runs_while_a_batch_commits(
    db: Database, example_config: IsthmusConfig
) -> None:
    """Issue 17: a batch's COMMIT (the fsync) waits in a worker thread, so the event loop
    keeps serving other work meanwhile; the submission is answered only after its commit."""
    result, answered_early, waited = _held_submit(
        db, example_config, "commit", lambda conn: True)  # the engine's commit hook
    assert waited == [True], "the loop was blocked while the batch committed"
    assert not answered_early, "answered before its commit"
    with db.read() as s:
        assert [j.id for j in list_jobs(s, limit=10)] == [result.job.id]


def test_the_event_loop_runs_while_a_batchs_statements_wait(
    db: Database, example_config: IsthmusConfig
) -> None:
    """A batch's statements run in the worker thread too: while one waits on the database
    (a lock another transaction holds, a server that is slow to answer), the loop keeps
    serving other requests. Written on the loop, every request of the replica waited for the
    batch's round trips (the soak's tail)."""
    result, answered_early, waited = _held_submit(
        db, example_config, "before_cursor_execute",
        lambda conn, cursor, statement, *_: statement.lstrip().upper().startswith(
            "INSERT INTO JOBS"))
    assert waited == [True], "the loop was blocked while the batch's insert waited"
    assert not answered_early, "answered before its insert"
    with db.read() as s:
        assert [j.id for j in list_jobs(s, limit=10)] == [result.job.id]


def test_a_failed_commit_is_done_again_with_savepoints(
    db: Database, example_config: IsthmusConfig
) -> None:
    """The worker thread's COMMIT fails once: nobody is answered from that transaction; the
    batch is written again (savepoints) and each request gets its own committed job."""
    failures: list[str] = []

    def fail_once(conn: Any) -> None:
        if not failures:
            failures.append("commit")
            raise RuntimeError("the disk said no")

    subs = [Submission(spec().name(f"f{i}").build(), "a", f"key{i}") for i in range(3)]

    event.listen(db.writer, "commit", fail_once)
    try:
        results = gathered(db, example_config, subs)
    finally:
        event.remove(db.writer, "commit", fail_once)
    assert failures == ["commit"]
    assert all(isinstance(r, Submitted) and r.created for r in results), results
    with db.read() as s:
        stored = {j.name: j.id for j in list_jobs(s, limit=10)}
        assert stored == {r.job.name: r.job.id for r in results if isinstance(r, Submitted)}
        assert list(check_all(s)) == []


def _queued_count() -> float:
    from broker.metrics import TRANSITIONS
    return float(TRANSITIONS.labels("VALIDATING", "QUEUED")._value.get())


def test_a_batch_whose_commit_fails_counts_each_submission_once(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transition metrics of a group-commit batch run after its commit: a batch whose
    commit fails and is done again with savepoints counts each job's QUEUED once."""
    real = SubmitQueue._batched
    failed: list[int] = []

    def commit_fails_once(self: SubmitQueue, subs: list[Submission], *audits: Any) -> Any:
        tx, out, held = real(self, subs, *audits)
        if not failed:
            failed.append(len(subs))

            def boom() -> None:
                raise RuntimeError("the disk is full")

            tx.callback(boom)  # runs before the commit: the transaction is rolled back
        return tx, out, held

    monkeypatch.setattr(SubmitQueue, "_batched", commit_fails_once)
    before = _queued_count()

    subs = [Submission(spec().name(f"c{i}").build(), "a") for i in range(3)]
    results = gathered(db, example_config, subs)
    assert failed == [3] and all(isinstance(r, Submitted) and r.created for r in results)
    assert _queued_count() - before == 3


def test_a_batchs_idempotency_keys_are_looked_up_in_one_statement(
    db: Database, example_config: IsthmusConfig
) -> None:
    """Issue 17: a group-commit batch of keyed submissions looks its keys up in one SELECT,
    not one per submission, and still answers replays, conflicts and new keys as before."""
    made = {k: submit_job(db, example_config, spec().name(k).build(), "a", k).job
            for k in ("r0", "r1")}
    other = submit_job(db, example_config, spec().name("x").team("language").build(), "b",
                       "shared").job
    subs = [
        Submission(spec().name("r0").build(), "a", "r0"),  # replay
        Submission(spec().name("changed").build(), "a", "r1"),  # key reused, new body
        Submission(spec().name("shared").build(), "a", "shared"),  # another team's key
        *(Submission(spec().name(f"n{i}").build(), "a", f"n{i}") for i in range(4)),
    ]
    selects: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "jobs" in statement:
            selects.append(statement)

    event.listen(db.writer, "before_cursor_execute", count)
    try:
        results = gathered(db, example_config, subs)
    finally:
        event.remove(db.writer, "before_cursor_execute", count)
    assert len(selects) == 1, selects
    r0, conflict, shared, *new = results
    assert isinstance(r0, Submitted) and not r0.created and r0.job.id == made["r0"].id
    assert isinstance(conflict, IdempotencyConflict) and conflict.job_id == made["r1"].id
    assert isinstance(shared, Submitted) and shared.created and shared.job.id != other.id
    assert all(isinstance(r, Submitted) and r.created for r in new)


def test_the_key_look_up_reads_only_the_pairs_asked_for(
    db: Database, example_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One team's batch never reads the jobs of another team that happens to use the same
    key names: the look-up matches (team, key) pairs, not every team with every key."""
    from broker.store import queries

    for team in ("vision", "language"):
        for i in range(5):
            submit_job(db, example_config, spec().name(f"{team}{i}").team(team).build(), "a",
                       f"k{i}")
    decoded: list[str] = []
    real = queries.job_from_row  # type: ignore[attr-defined]

    def counting(row: Any) -> Any:
        job = real(row)
        decoded.append(job.team)
        return job

    monkeypatch.setattr(queries, "job_from_row", counting)
    pairs = [("vision", f"k{i}") for i in range(5)] + [("language", "unused")]
    with db.read() as s:
        found = queries.jobs_by_idempotency_keys(s, pairs)
    assert sorted(found) == sorted(pairs[:5])
    assert decoded == ["vision"] * 5
