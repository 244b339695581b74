"""The per-(team, flavor) quota counters are written at a transaction's commit, so a release
no longer holds the counter row from the middle of its transaction. Before, a reconcile chunk
(job A released, counter row taken; then job B's row) and a cancel of B (B's row; then the
counter row) took the two rows in opposite orders and PostgreSQL aborted one of them as a
deadlock victim (the soak's 500s). Also: the reconciler ending a cancelled job's attempt
takes the job row first, and a route is done again after an injected deadlock."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker import ledger
from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.domain import JobState, Reason
from broker.orchestration import submission
from broker.orchestration.rules import Cause, Outcome
from broker.orchestration.submission import cancel_job, submit_job
from broker.orchestration.transitions import TransitionResult, set_state
from broker.store import attempts as att
from broker.store import records
from broker.store.queries import job_events
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

pytestmark = POSTGRES_ONLY  # row-lock order matters only where rows are locked


def _two_admitted(sim: Sim) -> tuple[str, str]:
    one = spec().flavors("h100-80g").build()
    a = submit_job(sim.plane.db, sim.plane.config, one, "t").job.id
    b = submit_job(sim.plane.db, sim.plane.config, one, "t").job.id
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 2
    with sim.plane.db.read() as s:
        assert ledger.usage(s)[("vision", "h100-80g")][0] > 0
    return a, b


def test_a_release_and_a_cancel_of_another_job_of_the_team_do_not_deadlock(sim: Sim) -> None:
    a, b = _two_admitted(sim)
    done: list[TransitionResult | BaseException] = []

    def cancel_b() -> None:  # cancel_job's transaction, without its retry on a conflict
        try:
            with sim.plane.db.write() as s:
                done.append(set_state(s, b, JobState.CANCELLED, Reason.CancelledByUser,
                                      Cause("api", "alice")))
        except BaseException as exc:  # reported by the assertion below
            done.append(exc)

    canceller = threading.Thread(target=cancel_b)
    with sim.plane.db.write() as s:  # what a reconcile chunk does: A ends, then B's row
        assert records.lock_job(s, a) is not None
        assert set_state(s, a, JobState.FAILED, Reason.InfraTransient,
                         Cause("reconciler", "system:reconciler")).accepted
        canceller.start()  # B's row, B's release; before: then the counter row A holds
        wait_until(lambda: done or lock_waiters(sim.plane.db) >= 1, 60,
                   "the cancel to end or to wait on a lock")
        records.lock_job(s, b)  # before: a lock-order cycle, one of the two aborted
    canceller.join(timeout=60)
    assert not canceller.is_alive()
    assert len(done) == 1 and isinstance(done[0], TransitionResult), done
    assert done[0].outcome is Outcome.ACCEPT
    with sim.plane.db.read() as s:
        assert ledger.usage(s)[("vision", "h100-80g")] == (0, 0)
        assert ledger.check(s) == []


def _deadlock() -> sa.exc.OperationalError:
    orig = psycopg.errors.DeadlockDetected("deadlock detected (injected)")
    return sa.exc.OperationalError("UPDATE quota_usage ...", {}, orig)


def test_a_cancel_aborted_as_a_deadlock_victim_is_done_again_once(
    sim: Sim, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = _two_admitted(sim)
    real, calls = set_state, []

    def victim_once(*args: Any, **kwargs: Any) -> TransitionResult:
        calls.append(1)
        result = real(*args, **kwargs)  # its writes are made, then the transaction aborts
        if len(calls) == 1:
            raise _deadlock()
        return result

    monkeypatch.setattr(submission, "set_state", victim_once)
    client = TestClient(create_app(sim.plane.config, sim.plane.db), raise_server_exceptions=False)
    answer = client.post(f"/v1/jobs/{a}/cancel")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "CANCELLED" and len(calls) == 2
    with sim.plane.db.read() as s:
        cancelled = [e for e in job_events(s, a) if e.to_state == "CANCELLED"]
        assert ledger.check(s) == [] and ledger.usage(s)[("vision", "h100-80g")][0] == 16  # B's
    assert len(cancelled) == 1  # the aborted try left nothing: one cancel, one release
    assert [r.name for r in caplog.records if "aborted by a lock conflict" in r.getMessage()] == [
        "isthmus.store.conflicts"]  # each try again is logged


def test_a_reconcile_ending_a_cancelled_attempt_waits_for_a_progress_report(sim: Sim) -> None:
    """The reconciler ends a cancelled job's attempt (attempt row, then ledger entries whose
    foreign key takes a share lock on the job row) while a progress report holds the job row
    and then updates the attempt: before, a lock-order cycle (the report's 500 in the soak)."""
    a, _ = _two_admitted(sim)
    assert cancel_job(sim.plane.db, a, "alice", False).accepted
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, a, 1)
    assert attempt is not None and attempt.ended_at is None
    done: list[object] = []

    def reconcile() -> None:
        try:
            done.append(run_reconcile(sim.plane, attempt.backend))
        except BaseException as exc:  # reported by the assertion below
            done.append(exc)

    reconciler = threading.Thread(target=reconcile)
    with sim.plane.db.write() as s:  # what the progress route does: job row, then attempt row
        assert records.lock_job(s, a) is not None
        reconciler.start()
        wait_until(lambda: done or lock_waiters(sim.plane.db) >= 1, 60,
                   "the reconcile pass to end or to wait on a lock")
        att.update(s, a, 1, last_step=7)  # before: a lock-order cycle, one of the two aborted
    reconciler.join(timeout=60)
    assert not reconciler.is_alive()
    assert len(done) == 1 and not isinstance(done[0], BaseException), done
    with sim.plane.db.read() as s:
        ended = att.get_attempt(s, a, 1)
        assert ended is not None and ended.ended_at is not None and ended.last_step == 7
        assert ledger.check(s) == []
