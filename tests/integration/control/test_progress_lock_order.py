"""A progress report takes the job row before the attempt row, the order set_state and the
reconciler take them. A report that updated the attempt first and then the job deadlocked
against a reconcile pass holding the job row (PostgreSQL aborted one of them: a 500)."""

from __future__ import annotations

import threading

import httpx
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.domain.clock import utcnow
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store import records
from broker.store.queries import get_job
from broker.store.records import JobRecord
from broker.store.secrets import progress_token, server_secret
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

pytestmark = POSTGRES_ONLY  # row-lock order matters only where rows are locked


def _dispatched(sim: Sim) -> tuple[JobRecord, TestClient, str, dict[str, str]]:
    """A job dispatched, not yet at work: the job, an API client, its progress URL and the
    attempt's token header."""
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 1
    token = progress_token(server_secret(sim.plane.db, "progress"), job.id, 1)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    return job, client, f"/v1/jobs/{job.id}/progress", {"Authorization": f"Bearer {token}"}


def _at_work(sim: Sim) -> tuple[JobRecord, TestClient, str, dict[str, str]]:
    """`_dispatched`, and at work (its first report taken)."""
    job, client, url, auth = _dispatched(sim)
    assert client.post(url, json={"step": 1}, headers=auth).status_code == 200  # first work
    return job, client, url, auth


def test_a_progress_report_waits_for_a_reconcile_holding_the_job_row(sim: Sim) -> None:
    job, client, url, auth = _dispatched(sim)
    answers: list[httpx.Response] = []
    reporter = threading.Thread(target=lambda: answers.append(
        client.post(url, json={"step": 5}, headers=auth)))
    with sim.plane.db.write() as s:  # what a reconcile pass does: job row, then attempt row
        assert records.lock_job(s, job.id) is not None
        reporter.start()
        wait_until(lambda: lock_waiters(sim.plane.db) >= 1, 60,
                   "the progress report to wait on a lock")
        att.update(s, job.id, 1, last_seen_at=utcnow())
    reporter.join(timeout=60)
    assert not reporter.is_alive()
    assert [a.status_code for a in answers] == [200], [a.text for a in answers]
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and attempt.last_step == 5 and attempt.last_seen_at is not None


def test_a_step_report_does_not_wait_for_the_job_row_and_a_checkpoint_does(sim: Sim) -> None:
    """A step of a job already at work locks its attempt row alone (one statement, then the
    commit: nothing to deadlock with), so a pass holding the job row does not hold it up; a
    checkpoint still waits for that pass (it may be ending the attempt)."""
    job, client, url, auth = _at_work(sim)
    answers: list[httpx.Response] = []

    def report(body: dict[str, object]) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.append(
            client.post(url, json=body, headers=auth)))
        thread.start()
        return thread

    with sim.plane.db.write() as s:
        assert records.lock_job(s, job.id) is not None
        step = report({"step": 2})
        step.join(timeout=60)
        assert not step.is_alive() and [a.status_code for a in answers] == [200]
        checkpoint = report({"step": 3, "checkpoint": "/ckpt/3"})
        wait_until(lambda: lock_waiters(sim.plane.db) >= 1, 60,
                   "the checkpoint report to wait on the job row")
    checkpoint.join(timeout=60)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and (attempt.last_step, attempt.checkpoint_step) == (3, 3)


def test_a_step_report_waiting_while_a_pass_ends_the_attempt_is_refused_and_writes_nothing(
    sim: Sim,
) -> None:
    """The step report's one statement waits for the attempt row a reconcile pass holds while
    it ends the attempt; once that commits, the report's condition (attempt not ended) is
    read again: it writes nothing and is answered 409, never a step on an ended attempt."""
    job, client, url, auth = _at_work(sim)
    answers: list[httpx.Response] = []
    reporter = threading.Thread(target=lambda: answers.append(
        client.post(url, json={"step": 7}, headers=auth)))
    with sim.plane.db.write() as s:  # what a reconcile pass does: job row, then attempt row
        assert records.lock_job(s, job.id) is not None
        att.update(s, job.id, 1, ended_at=utcnow())
        reporter.start()
        wait_until(lambda: lock_waiters(sim.plane.db) >= 1, 60,
                   "the step report to wait for the attempt row")
    reporter.join(timeout=60)
    assert not reporter.is_alive()
    assert [a.status_code for a in answers] == [409], [a.text for a in answers]
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and attempt.last_step == 1


def test_a_first_report_waiting_while_a_pass_ends_the_attempt_is_refused_and_writes_nothing(
    sim: Sim,
) -> None:
    """A job's first report sets its first useful work in one statement that waits for the job
    row a pass holds; the pass ends the attempt meanwhile. PostgreSQL checks the attempt as of
    the statement's start (running), so the job row is written; the attempt's write that
    follows finds it ended: 409, and the first useful work is rolled back with it."""
    job, client, url, auth = _dispatched(sim)
    answers: list[httpx.Response] = []
    reporter = threading.Thread(target=lambda: answers.append(
        client.post(url, json={"step": 3}, headers=auth)))
    with sim.plane.db.write() as s:  # what a reconcile pass does: job row, then attempt row
        assert records.lock_job(s, job.id) is not None
        reporter.start()
        wait_until(lambda: lock_waiters(sim.plane.db) >= 1, 60,
                   "the first report to wait for the job row")
        att.update(s, job.id, 1, ended_at=utcnow())
    reporter.join(timeout=60)
    assert not reporter.is_alive()
    assert [a.status_code for a in answers] == [409], [a.text for a in answers]
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
        row = get_job(s, job.id)
    assert attempt is not None and attempt.last_step is None
    assert row is not None and row.first_useful_work_at is None
