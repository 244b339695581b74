"""Issue 17: the admission cycle persists its decisions with statements batched across jobs
(broker.store.batch). The batch must write exactly what the per-job path writes, a job whose
step fails is cut out of the batch alone, and a batch that fails as a whole is redone job by
job."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.config import IsthmusConfig
from broker.control import admission, admission_writes
from broker.store import Database, open_database
from broker.store import attempts as att
from broker.store.records import EVENTS, JOBS
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY
from tests.harness.sim import Sim, consistent, make_sim, mixed_backlog, state, submit
from tests.integration.control.chunk_hold import ChunkHold
from tests.integration.control.poison import events


def _sim(db: Database, config: IsthmusConfig) -> Sim:
    """The same federation as the `sim` fixture, on `db`."""
    return make_sim(db, config)



def _written(db: Database) -> dict[str, Any]:
    """Everything admission writes, with job ids replaced by job names (ids are random)."""
    with db.read() as s:
        conn = s.connection()
        names: dict[str, str] = {row[0]: row[1] for row in conn.execute(
            sa.select(JOBS.c.id, JOBS.c.name))}

        def plain(value: object) -> object:
            if isinstance(value, str):
                for jid, name in names.items():
                    value = value.replace(jid, name)
            return value

        def rows(table: sa.Table, *skip: str) -> list[tuple[object, ...]]:
            cols = [c for c in table.c if c.name not in ("id", *skip)]
            return sorted(
                (tuple(plain(v) for v in r) for r in conn.execute(sa.select(*cols))), key=repr
            )

        return {
            "jobs": rows(JOBS, "created_at", "updated_at", "spec_json", "spec_hash"),
            "events": rows(EVENTS, "at"),
            "attempts": rows(att.ATTEMPTS, "created_at", "spec_hash"),
            "ledger": rows(ENTRIES, "at"),
            "usage": rows(ledger.USAGE),
            "explanations": rows(att.EXPLANATIONS, "at"),
        }


@pytest.fixture
def other_db(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A second, empty database of the same kind as `db`."""
    if db_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'per-job.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        url = str(server.url(server.new_database(request.getfixturevalue("pg_template"))))
    database = open_database(url, sqlite_synchronous="NORMAL")
    yield database
    database.dispose()


def test_the_batch_writes_what_the_per_job_path_writes(
    sim: Sim, other_db: Database, sim_config: IsthmusConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_job = _sim(other_db, sim_config)
    for one in (sim, per_job):
        mixed_backlog(one)
    calls = {"batched": 0}
    original = admission_writes._persist_batched

    def counted(*args: Any, **kwargs: Any) -> None:
        calls["batched"] += 1
        original(*args, **kwargs)

    monkeypatch.setattr(admission_writes, "_persist_batched", counted)
    admission.run_admission(sim.plane)
    assert calls["batched"] == 1  # the batch ran (and did not fall back)
    monkeypatch.setattr(admission_writes, "BATCH", False)
    admission.run_admission(per_job.plane)
    assert calls["batched"] == 1
    batched, each = _written(sim.plane.db), _written(other_db)
    assert any(e[3] == "ADMITTED" for e in batched["events"])  # (job, seq, from, to, ...)
    assert any(e[2] == "QUEUED" and e[3] == "QUEUED" for e in batched["events"])
    for table in batched:
        assert batched[table] == each[table], table
    consistent(sim)


def test_a_job_that_fails_in_the_batch_is_cut_out_alone(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs, _ = mixed_backlog(sim)
    bad = jobs[1]
    original = att.insert_attempt

    def insert_or_fail(s: Any, rec: att.AttemptRecord) -> None:
        if rec.job_id == bad:  # after its state, event and reservation were queued
            raise RuntimeError("a bug met only by this job")
        original(s, rec)

    monkeypatch.setattr(att, "insert_attempt", insert_or_fail)
    admission.run_admission(sim.plane)
    assert state(sim, bad) == ("QUEUED", "InternalError")
    assert "admission persist (RuntimeError)" in events(sim, bad)[-1][2]
    assert [e[0] for e in events(sim, bad)].count("ADMITTED") == 0
    for j in jobs:
        if j != bad:
            assert state(sim, j) == ("ADMITTED", "Admitted")
    with sim.plane.db.read() as s:
        assert att.attempts_of(s, bad) == []
        assert s.connection().execute(
            sa.select(sa.func.count()).select_from(ENTRIES)
            .where(ENTRIES.c.job_id == bad)
        ).scalar_one() == 0
    consistent(sim)  # its reservation was dropped with its other writes


def test_a_batch_that_fails_as_a_whole_is_redone_job_by_job(
    sim: Sim, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    jobs, waiting = mixed_backlog(sim)
    from broker.store import batch

    def broken_flush(self: batch.Deferred, session: Any) -> None:
        raise sa.exc.IntegrityError("INSERT ...", {}, Exception("a constraint"))

    monkeypatch.setattr(batch.Deferred, "flush", broken_flush)
    with caplog.at_level(logging.WARNING, logger="isthmus.control"):
        admission.run_admission(sim.plane)
    assert any("per job instead" in r.getMessage() for r in caplog.records)
    for j in jobs:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    for j in waiting:
        assert state(sim, j)[0] == "QUEUED"
        assert [e[0] for e in events(sim, j)][-2:] == ["QUEUED", "QUEUED"]
    consistent(sim)


def _count(src: str, dst: str) -> float:
    from broker.metrics import REGISTRY

    value = REGISTRY.get_sample_value(
        "isthmus_transitions_total", {"from_state": src, "to_state": dst}
    )
    return value or 0.0


@pytest.mark.parametrize("where", ["flush", "commit"])
def test_a_batch_done_again_job_by_job_counts_each_transition_once(
    sim: Sim, monkeypatch: pytest.MonkeyPatch, where: str,
) -> None:
    jobs, waiting = mixed_backlog(sim)
    from broker.store import batch

    failed = {"n": 0}
    if where == "flush":  # the database refuses the batch's rows
        def broken_flush(self: batch.Deferred, session: Any) -> None:
            failed["n"] += 1
            raise sa.exc.IntegrityError("INSERT ...", {}, Exception("a constraint"))

        monkeypatch.setattr(batch.Deferred, "flush", broken_flush)
    else:  # the batch was written, then its transaction failed before the commit
        original = admission_writes.mark_all

        def broken_marks(s: Any, incidents: Any, now: Any) -> None:
            if not incidents and failed["n"] == 0:
                failed["n"] += 1
                raise RuntimeError("the transaction fails after the flush")
            original(s, incidents, now)

        monkeypatch.setattr(admission_writes, "mark_all", broken_marks)
    admitted, requeued = _count("QUEUED", "ADMITTED"), _count("QUEUED", "QUEUED")
    admission.run_admission(sim.plane)
    assert failed["n"] >= 1  # the batch did fail and was done again job by job
    for j in jobs:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    assert _count("QUEUED", "ADMITTED") - admitted == len(jobs)
    assert _count("QUEUED", "QUEUED") - requeued == len(waiting)
    consistent(sim)


@POSTGRES_ONLY  # SQLite serialises writers on the whole database: a cancel waits there anyway
def test_a_cancel_is_answered_while_a_chunk_is_written_and_the_chunk_is_written_again(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27, the soak: a cancel of a job in an admission chunk waited for all of the
    chunk's Python (~90 ms at the median), because the chunk locked its jobs first. Now it
    locks them once its writes are decided: a cancel committed in between is answered at
    once, and the chunk, finding its job moved, is written again under the locks."""
    jobs = [submit(sim, spec().name(f"c{i}").flavors("a100-80g").replicas(1).gpus(1)
                   .topology(None).backend("k8s"), 60) for i in range(3)]
    hold = ChunkHold(monkeypatch)
    hold.after(admission_writes, "_persist_one",  # the first try's writes all decided
               lambda calls: calls.count("decided") == len(jobs))
    hold.record_locks()
    out = hold.cancel_meanwhile(sim, lambda: admission.run_admission(sim.plane), jobs[0],
                                "the cancel waited for the chunk being decided")
    assert out["c"].job.state == "CANCELLED"
    # decided, then locked and found moved; written again, its jobs locked first
    assert hold.calls == ["decided"] * 3 + ["checked", "locked"] + ["decided"] * 3
    assert state(sim, jobs[0]) == ("CANCELLED", "CancelledByUser")
    for j in jobs[1:]:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    assert "ADMITTED" not in [e[0] for e in events(sim, jobs[0])]
    with sim.plane.db.read() as s:
        assert att.attempts_of(s, jobs[0]) == []  # nothing reserved, nothing to dispatch
    consistent(sim)
