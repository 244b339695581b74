"""Issue 17, the soak on PostgreSQL: the batched admission met the other writers of the quota
counters (cancels, reconcile passes) in deadlocks, and one deadlock threw the whole pass away.
A batch now takes the counters' locks last, one row per counter in key order, and a chunk
aborted by a lock conflict is written again."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from broker.control import admission
from broker.store import batch, quota_counters
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim, consistent, mixed_backlog, state, submit
from tests.harness.wait import wait_until
from tests.integration.control.poison import events


class _Deadlock(Exception):
    sqlstate = "40P01"


def test_a_chunk_aborted_by_a_deadlock_is_written_again(
    sim: Sim, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    jobs, waiting = mixed_backlog(sim)
    original = batch.Deferred.flush
    aborted = {"n": 0}

    def deadlocked_once(self: batch.Deferred, session: Any) -> None:
        if aborted["n"] == 0:
            aborted["n"] += 1
            original(self, session)  # written, then the database picks it as the victim
            raise sa.exc.OperationalError("UPDATE quota_usage ...", {}, _Deadlock("deadlock"))
        original(self, session)

    monkeypatch.setattr(batch.Deferred, "flush", deadlocked_once)
    with caplog.at_level(logging.WARNING, logger="isthmus.control"):
        admission.run_admission(sim.plane)
    assert aborted["n"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("lock conflict" in m for m in messages)
    assert not any("per job instead" in m for m in messages)
    for j in jobs:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    for j in waiting:
        assert state(sim, j)[0] == "QUEUED"
    consistent(sim)  # written once: counters equal the ledger


def test_other_database_errors_still_end_the_pass(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    mixed_backlog(sim)

    def gone(self: batch.Deferred, session: Any) -> None:
        raise sa.exc.OperationalError("INSERT ...", {}, Exception("server closed the connection"))

    monkeypatch.setattr(batch.Deferred, "flush", gone)
    with pytest.raises(sa.exc.OperationalError):
        admission.run_admission(sim.plane)


@POSTGRES_ONLY  # row-lock order matters only where rows are locked
def test_a_batch_and_a_writer_of_the_counters_in_key_order_do_not_deadlock(
    sim: Sim, caplog: pytest.LogCaptureFixture,
) -> None:
    """Told by what PostgreSQL does, not by the statements' text: another writer holds the
    first counter of the batch (language, a100-80g), the batch comes to wait for it, and the
    other writer then takes the batch's later counters (vision's). A batch that took its
    counters in another order, or before its job rows, would hold one of them by then: a
    lock-order cycle, one of the two aborted as a deadlock victim."""
    jobs, waiting = mixed_backlog(sim)  # counters of (language, a100), (vision, a100|h100)
    counters = [("language", "a100-80g"), ("vision", "a100-80g"), ("vision", "h100-80g")]
    done: list[object] = []

    def admit() -> None:
        try:
            done.append(admission.run_admission(sim.plane))
        except BaseException as exc:  # reported by the assertion below
            done.append(exc)

    cycle = threading.Thread(target=admit)
    with caplog.at_level(logging.WARNING), sim.plane.db.write() as s:
        upsert = quota_counters.UPSERT
        s.connection().execute(upsert, {"t": "language", "f": "a100-80g", "g": 0, "b": 0})
        cycle.start()
        wait_until(lambda: done or lock_waiters(sim.plane.db) >= 1, 120,
                   "the admission cycle to end or to wait on a lock")
        assert not done, "the cycle never met the counter held here"
        for team, flavor in counters[1:]:  # before: a lock-order cycle, one of the two aborted
            s.connection().execute(upsert, {"t": team, "f": flavor, "g": 0, "b": 0})
    cycle.join(timeout=120)
    assert not cycle.is_alive()
    assert len(done) == 1 and not isinstance(done[0], BaseException), done
    conflicts = [r.getMessage() for r in caplog.records if "lock conflict" in r.getMessage()]
    assert conflicts == []  # nothing was aborted and written again
    for j in jobs:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    for j in waiting:
        assert state(sim, j)[0] == "QUEUED"
    consistent(sim)


def test_a_waiting_jobs_view_is_built_once_until_its_exclusions_change(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from broker.store.records import JOBS

    _, waiting = mixed_backlog(sim)
    admission.run_admission(sim.plane)  # the workload's admissions; the big gangs wait
    built: list[str] = []
    from broker.policy_inputs import pending_job as original

    def counted(config: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
        built.append(job_id)
        return original(config, job_id, *args, **kwargs)

    monkeypatch.setattr(admission, "pending_job", counted)
    admission.run_admission(sim.plane)
    assert built == []  # both still waiting, their views kept from the first cycle
    with sim.plane.db.write() as s:
        s.connection().execute(sa.update(JOBS).where(JOBS.c.id == waiting[0])
                               .values(exclude_json='{"pools": ["slurm-h100"]}'))
    admission.run_admission(sim.plane)
    assert built == [waiting[0]]  # a new view for the job whose exclusions changed
    assert state(sim, waiting[1])[0] == "QUEUED"


def test_a_preemption_aborted_by_a_deadlock_is_done_again_and_the_pass_goes_on(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from broker.control import preempt_batch
    from tests.harness.sim import cycle, run_until

    lows = [submit(sim, spec().name(f"low-{t}").team(t).flavors("h100-80g").replicas(2)
                   .topology(None).set("priority", "low"), 3600) for t in ("vision", "language")]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)  # past the minimum runtime that protects new work
    urgent = submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 60)
    original = preempt_batch._write
    tries: list[list[str]] = []

    def deadlocked_once(plane: Any, signalled: Any, now: Any) -> None:
        tries.append([v.job_id for v, _, _ in signalled])
        if len(tries) == 1:
            raise sa.exc.OperationalError("INSERT INTO ledger_entries ...", {},
                                          _Deadlock("deadlock"))
        original(plane, signalled, now)

    monkeypatch.setattr(preempt_batch, "_write", deadlocked_once)
    admission.run_admission(sim.plane)  # the deadlock ended the whole pass
    assert len(tries) == 2 and tries[0] == tries[1]  # the same victims' batch, again
    for victim in tries[0]:
        assert ("RETRYING", "Preempted") in [(e[0], e[1]) for e in events(sim, victim)]
    assert state(sim, urgent)[0] == "QUEUED"
    consistent(sim)
