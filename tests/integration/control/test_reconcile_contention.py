"""Issue 17, the soak on PostgreSQL: a reconcile chunk that lost a deadlock (against a cancel, a
progress report or the admission) ended the whole pass, and the jobs of that chunk and of every
chunk after it (their ends, the GPUs they free) waited for a later pass. The chunk is now
written again; and it locks its jobs in one statement, in id order, as the admission does."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa

from broker.control import reconcile_apply
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.store import attempts as att
from broker.store import records
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.sim import Sim, attempts_of, consistent, state, submit
from tests.harness.statements import rows_of
from tests.integration.control.chunk_hold import ChunkHold
from tests.integration.control.poison import events


class _Deadlock(Exception):
    sqlstate = "40P01"


def _running(sim: Sim, n: int) -> list[str]:
    jobs = [submit(sim, spec().name(f"r{i}").flavors("a100-80g").replicas(1).gpus(1)
                   .topology(None).backend("k8s"), 60) for i in range(n)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    return jobs


def test_a_chunk_aborted_by_a_deadlock_is_written_again_and_the_pass_goes_on(
    sim: Sim, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = _running(sim, 5)
    monkeypatch.setattr(reconcile_apply, "APPLY_CHUNK", 2)  # three chunks; the 2nd deadlocks
    original = records.lock_unmoved
    calls: list[list[str]] = []

    def deadlocked_once(session: Any, seen: dict[str, int]) -> None:
        calls.append(sorted(seen))
        if len(calls) == 2:  # the database picked this chunk's transaction as the victim
            raise sa.exc.OperationalError("SELECT ... FOR UPDATE", {}, _Deadlock("deadlock"))
        original(session, seen)

    monkeypatch.setattr(records, "lock_unmoved", deadlocked_once)
    sim.advance(30)
    with caplog.at_level(logging.WARNING, logger="isthmus.control"):
        report = run_reconcile(sim.plane, "sim-k8s")  # raised OperationalError
    assert [len(c) for c in calls] == [2, 2, 2, 1]
    assert calls[1] == calls[2]  # the same chunk, again
    assert any("lock conflict" in r.getMessage() for r in caplog.records)
    for j in jobs:
        assert state(sim, j) == ("RUNNING", "Running")
    assert report.transitions == len(jobs)  # counted once: the aborted try kept nothing
    for j in jobs:
        assert [e[0] for e in events(sim, j)].count("RUNNING") == 1
    consistent(sim)


def test_other_database_errors_still_end_the_pass(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _running(sim, 2)

    def gone(session: Any, seen: dict[str, int]) -> None:
        raise sa.exc.OperationalError("SELECT ...", {}, Exception("server closed the connection"))

    monkeypatch.setattr(records, "lock_unmoved", gone)
    sim.advance(30)
    with pytest.raises(sa.exc.OperationalError):
        run_reconcile(sim.plane, "sim-k8s")


def test_a_chunk_locks_its_jobs_in_one_statement_in_id_order(sim: Sim) -> None:
    jobs = _running(sim, 6)
    sent: list[tuple[str, str, Any]] = []
    rows: dict[int, int] = {}

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
             many: bool) -> None:
        rows[len(sent)] = rows_of(statement, params, many)
        sent.append((conn.dialect.name, statement, params))

    sim.advance(30)
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        run_reconcile(sim.plane, "sim-k8s")
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    locks = [p for dialect, sql, p in sent if dialect == "postgresql"
             and sql.startswith("SELECT jobs.id") and "FOR UPDATE" in sql]
    if any(dialect == "postgresql" for dialect, _, _ in sent):  # SQLite has no row locks
        assert len(locks) == 1  # the chunk's six jobs in one statement
        values = locks[0].values() if isinstance(locks[0], dict) else locks[0]
        flat = [x for v in values for x in (v if isinstance(v, list | tuple) else [v])]
        assert [v for v in flat if v in jobs] == sorted(jobs)
    writes = [rows[i] for i, (_, sql, _) in enumerate(sent)
              if sql.startswith("UPDATE attempts SET") and "resolved_json IS NULL" not in sql]
    assert len(writes) == 1  # the chunk's attempt rows in one statement (an executemany)
    assert writes[0] == len(jobs)  # each attempt's row written once, not per field group
    with sim.plane.db.read() as s:
        for j in jobs:
            a = att.attempts_of(s, j)[-1]
            assert a.phase == "RUNNING" and a.started_at is not None and a.last_seen_at


def test_a_chunk_releases_the_quota_counters_in_key_order(sim: Sim) -> None:
    """Endings of two teams on two flavors, submitted so that job order and counter order
    differ: the releases reach the counters in (team, flavor) order."""
    jobs = []
    for i, (team, flavor) in enumerate([("vision", "h100-80g"), ("language", "a100-80g"),
                                        ("vision", "a100-80g"), ("language", "h100-80g")] * 2):
        jobs.append(submit(sim, spec().name(f"k{i}").team(team).flavors(flavor).replicas(1)
                           .gpus(1).topology(None), 300))
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    for _ in range(20):
        sim.advance(10)
        for backend in ("sim-k8s", "sim-slurm"):
            run_reconcile(sim.plane, backend)
        if all(state(sim, j)[0] == "RUNNING" for j in jobs):
            break
    for j in jobs:
        assert state(sim, j)[0] == "RUNNING"
    sent: list[tuple[str, str]] = []  # (team, flavor) of each counter write, in order

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
             many: bool) -> None:
        verb = statement.split()[0]
        if "quota_usage" not in statement or verb not in ("UPDATE", "INSERT"):
            return
        for p in params if many else [params]:
            if isinstance(p, dict):
                sent.append((p["t"], p["f"]))
            else:  # SQLite's positional parameters: SET ... WHERE team, flavor / VALUES (t, f, ..)
                sent.append((p[2], p[3]) if verb == "UPDATE" else (p[0], p[1]))

    sim.advance(400)
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        for backend in ("sim-k8s", "sim-slurm"):
            start = len(sent)
            run_reconcile(sim.plane, backend)
            keys = sent[start:]
            assert keys == sorted(keys), backend
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    assert len(sent) >= 4
    for j in jobs:
        assert state(sim, j)[0] == "SUCCEEDED"
    consistent(sim)


@POSTGRES_ONLY  # SQLite serialises writers on the whole database: a cancel waits there anyway
def test_a_cancel_is_answered_while_a_chunk_decides_and_the_chunk_is_written_again(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27, the soak: a cancel (or a progress report) of a job in a reconcile chunk
    waited for all of the chunk's Python, ~50 ms at the median and up to ~0.9 s, because the
    chunk locked its jobs first. Now it locks them once its writes are decided: a cancel
    committed in between is answered at once, and the chunk, finding its job moved, is
    written again under the locks, the cancel kept."""
    jobs = _running(sim, 3)
    sim.advance(30)  # the three have started: one chunk of three RUNNING transitions
    hold = ChunkHold(monkeypatch)
    hold.after(reconcile_apply, "_write_locked", lambda calls: True)  # the first try
    hold.record_locks()
    out = hold.cancel_meanwhile(sim, lambda: run_reconcile(sim.plane, "sim-k8s"), jobs[0],
                                "the cancel waited for the chunk that was deciding")
    assert out["c"].job.state == "CANCELLED"
    # decided, then locked and found moved; written again, its jobs locked first
    assert hold.calls == ["decided", "checked", "locked", "decided"]
    assert state(sim, jobs[0]) == ("CANCELLED", "CancelledByUser")
    for j in jobs[1:]:
        assert state(sim, j) == ("RUNNING", "Running")
    assert out["r"].transitions == 2  # the cancelled job's RUNNING was not applied
    assert "RUNNING" not in [e[0] for e in events(sim, jobs[0])]
    consistent(sim)


@POSTGRES_ONLY
def test_a_cancel_is_answered_while_a_chunk_decides_retries(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk whose attempts failed decides their retries before it locks its jobs; the
    retry's terms (when the job may go again, the nodes it avoids) were written to the job's
    row at once, in the middle of that deciding, so a cancel of a job being retried waited for
    the chunk again (found in review). They are queued with the chunk's other writes."""
    jobs = _running(sim, 2)
    sim.advance(30)
    run_reconcile(sim.plane, "sim-k8s")
    assert [state(sim, j)[0] for j in jobs] == ["RUNNING"] * 2
    k8s = sim.backends["sim-k8s"]
    for node in sorted({k8s.jobs[attempts_of(sim, j)[-1].backend_name].nodes[0]
                        for j in jobs}):
        k8s.fail_node(node)
    sim.advance(10)
    hold = ChunkHold(monkeypatch)
    hold.after(reconcile_apply, "_write_locked", lambda calls: True)  # its retries decided
    out = hold.cancel_meanwhile(sim, lambda: run_reconcile(sim.plane, "sim-k8s"), jobs[0],
                                "the cancel waited for the chunk's retry decision")
    assert out["c"].job.state == "CANCELLED"
    assert state(sim, jobs[0])[0] == "CANCELLED"
    assert state(sim, jobs[1]) == ("QUEUED", "BackoffAfterFailure")
    consistent(sim)
