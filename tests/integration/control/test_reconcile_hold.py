"""Issue 17, the 50/s soak: a reconcile chunk holds its jobs' rows until it commits, and the
progress reports and the preemption wait for them. A chunk sent about thirteen statements per
ended attempt (three ledger look-ups, the submitter's look-up, an insert per ledger entry, the
event, the job's state, the attempt's row); it now reads its ledger entries in one statement
and sends its writes as one executemany per statement (broker.control.reconcile_apply), and a
write that fails when the chunk is sent still harms only its own job."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.control import reconcile_apply
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.orchestration.submission import cancel_job
from broker.store import ledger_lookups
from broker.store.tables import EVENTS, FACTS
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from tests.builders import spec
from tests.harness.sim import Sim, attempts_of, consistent, state, submit
from tests.harness.statements import statements_sent
from tests.integration.control.poison import events

ENDED = 8


def _running(sim: Sim, n: int) -> list[str]:
    jobs = [submit(sim, spec().name(f"h{i}").flavors("a100-80g").replicas(1).gpus(1)
                   .topology(None).backend("k8s"), 60) for i in range(n)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    for _ in range(10):
        sim.advance(10)
        run_reconcile(sim.plane, "sim-k8s")
        if all(state(sim, j)[0] == "RUNNING" for j in jobs):
            break
    assert [state(sim, j)[0] for j in jobs] == ["RUNNING"] * n
    return jobs


def _statements(sim: Sim) -> list[tuple[str, int]]:
    """The statements of one reconcile pass of sim-k8s: (first 60 characters, parameter
    sets)."""
    with statements_sent() as sent:
        run_reconcile(sim.plane, "sim-k8s")
    return [(sql[:60], n) for sql, n in sent]


def test_a_chunks_ledger_lookups_and_writes_are_sent_once_not_per_attempt(sim: Sim) -> None:
    jobs = _running(sim, ENDED)
    sim.advance(120)  # every job succeeds: one chunk of ENDED ended attempts
    sent = _statements(sim)
    assert [state(sim, j)[0] for j in jobs] == ["SUCCEEDED"] * ENDED
    by_start = Counter(sql for sql, _ in sent)
    lookups = [n for sql, n in sent if sql.startswith("SELECT ledger_entries")]
    assert len(lookups) == 1, by_start  # the chunk's entries read at once (was 3 per attempt)
    assert not any("submitted_by FROM jobs" in sql for sql, _ in sent)  # from the locked row
    for table in ("INSERT INTO job_events", "UPDATE jobs SET", "UPDATE attempts SET"):
        writes = [n for sql, n in sent if sql.startswith(table)]
        assert writes == [ENDED], (table, writes)  # one executemany of a row per attempt
    entries = [n for sql, n in sent if sql.startswith("INSERT INTO ledger_entries")]
    assert sorted(entries) == [ENDED, ENDED], entries  # the releases, the usage entries
    # nothing per attempt remains (13 statements each before; then its fact and its
    # cause-key look-up: test_a_chunks_facts_are_one_statement_and_their_causes_not_looked_up)
    assert len(sent) <= 20, by_start
    with sim.plane.db.read() as s:
        rows = s.connection().execute(
            sa.select(ENTRIES.c.job_id, ENTRIES.c.kind, ENTRIES.c.pool,
                      ENTRIES.c.submitted_by)
            .where(ENTRIES.c.job_id.in_(jobs))).all()
    booked = Counter(kind for _, kind, _, _ in rows)
    assert booked == {"reserve": ENDED, "release": ENDED, "usage": ENDED}, booked
    assert {(pool, user) for _, kind, pool, user in rows if kind == "usage"} == {
        (attempts_of(sim, jobs[0])[-1].pool, "tester")}
    consistent(sim)


def test_a_pass_reads_its_jobs_rows_once_under_their_locks(sim: Sim) -> None:
    """The decision what to apply takes the jobs' state and reason from the pass's narrow
    read (att.dispatched_brief); their full rows are read once, by the chunk (they were read a
    first time before, in the read of the changed attempts), which then locks them reading
    only their last_seq (records.lock_unmoved). A cancelled job's row is still read there: its
    object is cancelled and charged by the pass (it needs the spec)."""
    jobs = _running(sim, ENDED)
    sim.advance(120)
    sent = _statements(sim)
    assert [state(sim, j)[0] for j in jobs] == ["SUCCEEDED"] * ENDED
    rows = [sql for sql, _ in sent if sql.startswith("SELECT jobs.id, jobs.name")]
    assert len(rows) == 1, rows  # the chunk's read (queries.jobs_by_ids)
    more = _running(sim, 2)
    assert cancel_job(sim.plane.db, more[0], "tester", by_admin=False).accepted
    sent = _statements(sim)
    # its row read for the cancel, then locked by the cancel's own transaction
    rows = [sql for sql, _ in sent if sql.startswith("SELECT jobs.id, jobs.name")]
    assert len(rows) == 2, rows
    sim_k8s = sim.backends["sim-k8s"]
    cancelled = sim_k8s.job(attempts_of(sim, more[0])[-1].backend_name)
    assert cancelled is not None and cancelled.phase.value == "CANCELLED"
    still = sim_k8s.job(attempts_of(sim, more[1])[-1].backend_name)
    assert still is not None and still.phase.value == "RUNNING"
    consistent(sim)


def test_a_chunks_retry_decisions_look_their_causes_up_at_once(sim: Sim) -> None:
    """Attempts that fail in one chunk are retried in it (FAILED -> RETRYING -> QUEUED); the
    cause keys of those retry transitions (`retry:<n>`, `requeue:<n>`), which a repair could
    have applied before, are read together, not one look-up per transition."""
    jobs = _running(sim, ENDED)
    k8s = sim.backends["sim-k8s"]
    nodes = {k8s.jobs[attempts_of(sim, j)[-1].backend_name].nodes[0] for j in jobs}
    for node in sorted(nodes):
        k8s.fail_node(node)
    sent = _statements(sim)
    assert [state(sim, j) for j in jobs] == [("QUEUED", "BackoffAfterFailure")] * ENDED
    looked = [sql for sql, _ in sent if sql.startswith("SELECT job_events.job_id, job_events.")]
    one_by_one = [sql for sql in looked if sql.endswith("job_events.seq, job_events.at, job")]
    assert one_by_one == [], one_by_one  # 2 per failed attempt before
    at_once = [sql for sql in looked if "cause_key FROM" in sql]
    assert len(at_once) == 1, at_once
    consistent(sim)


def test_a_chunks_facts_are_one_statement_and_their_causes_not_looked_up(sim: Sim) -> None:
    """The chunk stores its attempts' facts in one statement (an insert and a look-up per
    attempt before, then a look-up of the chunk's causes, which name those new facts and so
    never had an event); each event still refers to the fact of its own job's attempt."""
    jobs = _running(sim, ENDED)
    sim.advance(120)
    sent = _statements(sim)
    assert [state(sim, j)[0] for j in jobs] == ["SUCCEEDED"] * ENDED
    assert len([sql for sql, _ in sent if sql.startswith("INSERT INTO facts")]) == 1, sent
    # their causes name the facts just inserted: nothing to look up (cause_lookups.fresh)
    assert not [sql for sql, _ in sent if sql.startswith("SELECT job_events")], sent
    with sim.plane.db.read() as s:
        rows = s.connection().execute(
            sa.select(EVENTS.c.job_id, FACTS.c.job_id, FACTS.c.attempt, FACTS.c.phase)
            .select_from(EVENTS.join(
                FACTS, EVENTS.c.facts_ref == sa.literal("fact:") + sa.cast(FACTS.c.id, sa.String)))
            .where(EVENTS.c.to_state == "SUCCEEDED", EVENTS.c.job_id.in_(jobs))).all()
    assert len(rows) == ENDED
    for job_id, fact_job, fact_attempt, phase in rows:
        assert (fact_job, fact_attempt, phase) == (
            job_id, attempts_of(sim, job_id)[-1].number, "SUCCEEDED"), rows
    consistent(sim)


def test_a_write_that_fails_when_the_chunk_is_sent_harms_only_its_own_job(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunk's queued writes are sent at its end; one that breaks a constraint there (here
    a usage entry the chunk's read-ahead is made to miss, so its charge books it twice) fails
    the chunk, which is written again attempt by attempt: the others' ends are recorded, the
    bad one is marked on its job and applied by a later pass."""
    jobs = _running(sim, 4)
    bad = sorted(jobs)[1]
    a = attempts_of(sim, bad)[-1]
    with sim.plane.db.write() as s:  # booked by another path the read-ahead will not see
        ledger.record_hours(s, ledger.Reservation(bad, a.number, "vision", a.flavor, a.gpus),
                            ledger.LedgerKind.USAGE, 0.0, a.created_at)
    original = ledger_lookups.lookup

    def blind(session: Any, job_id: str, attempt: int, kind: str) -> tuple[bool, Any]:
        if job_id == bad and kind == "usage":
            return True, None
        return original(session, job_id, attempt, kind)

    monkeypatch.setattr(ledger_lookups, "lookup", blind)
    sim.advance(120)
    run_reconcile(sim.plane, "sim-k8s")
    for j in jobs:
        if j != bad:
            assert state(sim, j)[0] == "SUCCEEDED", events(sim, j)
    assert state(sim, bad) == ("RUNNING", "InternalError")
    assert "reconcile (IntegrityError)" in events(sim, bad)[-1][2]
    monkeypatch.undo()
    run_reconcile(sim.plane, "sim-k8s")  # the next pass applies it; its usage booked once
    assert state(sim, bad)[0] == "SUCCEEDED"
    with sim.plane.db.read() as s:
        usage = s.connection().execute(
            sa.select(sa.func.count()).select_from(ENTRIES).where(
                ENTRIES.c.job_id == bad, ENTRIES.c.kind == "usage")).scalar_one()
    assert usage == 1
    consistent(sim)


def test_a_chunk_given_two_attempts_of_one_job_is_written_attempt_by_attempt(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass never gives a chunk two attempts of one job (a job has one live attempt: see
    reconcile_apply._write_locked, and the check in `consistent`), so a chunk does not read a
    job again after its savepoint. Given two anyway, the chunk is written attempt by attempt
    rather than trusting that."""
    jobs = _running(sim, 2)
    a, other = (attempts_of(sim, j)[-1] for j in jobs)
    backend = sim.backends["sim-k8s"]
    running = {f.backend_name: f for f in backend.observe()}[a.backend_name]
    sim.advance(120)  # both succeed
    ended = {f.backend_name: f for f in backend.observe()}
    sizes: list[int] = []
    original = reconcile_apply._write_chunk

    def counted(plane: Any, chunk: list[Any], now: Any) -> Any:
        sizes.append(len(chunk))
        return original(plane, chunk, now)

    monkeypatch.setattr(reconcile_apply, "_write_chunk", counted)
    reconcile_apply.apply_all(sim.plane, [(a, running), (a, ended[a.backend_name]),
                                          (other, ended[other.backend_name])], sim.plane.clock())
    assert sizes == [1, 1, 1]
    assert [state(sim, j)[0] for j in jobs] == ["SUCCEEDED"] * 2
    consistent(sim)


def test_cancelled_attempts_are_charged_with_the_submitter_of_their_job_row(sim: Sim) -> None:
    """The cancel path ends each cancelled job's attempt with the job record in hand: the
    ledger takes the submitter from it instead of reading it again, once per attempt."""
    jobs = _running(sim, 3)
    for job in jobs:
        assert cancel_job(sim.plane.db, job, "tester", by_admin=False).accepted
    sent = _statements(sim)
    assert [state(sim, j)[0] for j in jobs] == ["CANCELLED"] * 3
    assert not any("submitted_by FROM jobs" in sql for sql, _ in sent), sent
    with sim.plane.db.read() as s:
        booked = s.connection().execute(
            sa.select(ENTRIES.c.submitted_by)
            .where(ENTRIES.c.job_id.in_(jobs), ENTRIES.c.kind == "usage")).all()
    assert [r.submitted_by for r in booked] == ["tester"] * 3
    consistent(sim)
