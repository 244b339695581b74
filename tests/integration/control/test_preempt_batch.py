"""A cycle's victims are stopped in one write transaction, not three transactions each (under
the 50/s soak a cycle with 5-11 victims took 20-40 s); a batch that fails is done again victim
by victim, so one bad victim does not keep the others from being stopped."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from broker.control import admission, preempt
from broker.store import Database
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from tests.builders import spec
from tests.harness.sim import Sim, consistent, cycle, run_until, state, submit
from tests.harness.statements import statements_sent
from tests.integration.control.poison import events

VICTIMS = 4


def _lows_running(sim: Sim) -> list[str]:
    """Four one-node jobs filling the h100 pool, run past the minimum run time, and an urgent
    job that needs the whole pool: its plan names all four as victims."""
    lows = [submit(sim, spec().name(f"low-{i}").flavors("h100-80g").replicas(1).gpus(8)
                   .topology(None).set("priority", "low"), 3600) for i in range(VICTIMS)]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)
    submit(sim, spec().name("urgent").flavors("h100-80g").replicas(VICTIMS).gpus(8)
           .topology(None).set("priority", "high"), 60)
    return lows


def _counting(db: Database, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the transactions `db` opens (read and write)."""
    opened: Counter[str] = Counter()

    def wrap(kind: str, inner: Callable[[], Any]) -> Callable[[], Any]:
        @contextlib.contextmanager
        def counted() -> Iterator[Any]:
            opened[kind] += 1
            with inner() as s:
                yield s
        return counted

    monkeypatch.setattr(db, "write", wrap("write", db.write))
    monkeypatch.setattr(db, "read", wrap("read", db.read))
    return opened


def _preempted(sim: Sim, job_id: str) -> bool:
    return ("RETRYING", "Preempted") in [(e[0], e[1]) for e in events(sim, job_id)]


def test_a_cycles_victims_cost_two_write_transactions(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    lows = _lows_running(sim)
    opened = _counting(sim.plane.db, monkeypatch)

    admission.run_admission(sim.plane)
    monkeypatch.undo()  # what follows reads without counting
    counted = dict(opened)

    assert all(_preempted(sim, j) for j in lows), [events(sim, j) for j in lows]
    assert all(state(sim, j)[0] == "QUEUED" for j in lows)  # requeued in the same transaction
    # the preemption's two writes (its intent before the signals, its ending after:
    # preempt.mark_intents), the decisions' chunk and the cycle record; one read for all the
    # victims (one by one each victim cost 2 writes and 1 read: 10 writes and 7 reads here)
    assert counted["write"] <= 4, counted
    assert counted["read"] <= 4, counted
    consistent(sim)


def test_a_cycles_victims_are_charged_with_the_submitter_of_their_locked_rows(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    lows = _lows_running(sim)
    with statements_sent() as sent:
        admission.run_admission(sim.plane)

    assert all(_preempted(sim, j) for j in lows), [events(sim, j) for j in lows]
    # the submitter comes with the jobs the batch locks (one statement for the cycle), not
    # from the ledger's own look-up of an attempt's pool and job's submitter, once per victim
    who = [sql for sql, _ in sent if "attempts.pool, jobs.submitted_by" in sql]
    assert who == [], who
    with sim.plane.db.read() as s:
        booked = s.connection().execute(
            sa.select(ENTRIES.c.pool, ENTRIES.c.submitted_by)
            .where(ENTRIES.c.job_id.in_(lows), ENTRIES.c.kind == "usage")).all()
    assert [tuple(r) for r in booked] == [("slurm-h100", "tester")] * VICTIMS
    consistent(sim)


def test_a_cycles_victims_writes_are_one_statement_each_not_one_per_victim(sim: Sim) -> None:
    """The victims' ledger entries and their transitions' cause keys are read together, and
    their writes (events, job states, ledger entries) sent as one executemany per statement
    (as a reconcile chunk's), not once per victim."""
    lows = _lows_running(sim)
    with statements_sent() as sent:
        admission.run_admission(sim.plane)

    assert all(_preempted(sim, j) for j in lows), [events(sim, j) for j in lows]
    assert all(state(sim, j)[0] == "QUEUED" for j in lows)
    # two transitions a victim (RETRYING, then QUEUED): each statement once for all of them
    events_sent = [n for sql, n in sent if sql.startswith("INSERT INTO job_events")]
    assert sum(events_sent) >= 2 * VICTIMS and len(events_sent) <= 2, events_sent
    looked_up = [sql for sql, _ in sent if sql.startswith("SELECT job_events.job_id")]
    assert len(looked_up) == 1, looked_up  # the cause keys at once (was 2-3 per victim)
    ledger = [sql for sql, _ in sent if sql.startswith("SELECT ledger_entries.id")]
    assert len(ledger) == 1, ledger  # the victims' entries at once (was 2 per victim)
    consistent(sim)


def test_one_bad_victim_does_not_keep_the_others_from_being_stopped(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    lows = _lows_running(sim)
    bad = sorted(lows)[1]  # neither first nor last in the batch's lock order
    original = preempt.end_locked

    def end_locked(s: Any, plane: Any, locked: Any, *args: Any, **kwargs: Any) -> bool:
        if locked is not None and locked.id == bad:
            raise ValueError("a victim whose stored row cannot be ended")
        return original(s, plane, locked, *args, **kwargs)

    monkeypatch.setattr(preempt, "end_locked", end_locked)
    monkeypatch.setattr("broker.control.preempt_batch.end_locked", end_locked)

    admission.run_admission(sim.plane)

    others = [j for j in lows if j != bad]
    assert all(_preempted(sim, j) for j in others), [events(sim, j) for j in others]
    assert not _preempted(sim, bad)
    assert state(sim, bad)[0] == "RUNNING"  # left running, its incident logged and marked
    consistent(sim)


def test_the_running_views_tell_a_borrowed_reservation_from_a_nominal_one(sim: Sim) -> None:
    # language has no nominal h100 quota (all it holds there is borrowed); vision has 32
    borrower = submit(sim, spec().name("borrower").team("language").flavors("h100-80g")
                      .replicas(1).gpus(8).topology(None), 3600)
    owner = submit(sim, spec().name("owner").team("vision").flavors("h100-80g")
                   .replicas(1).gpus(8).topology(None), 3600)
    for j in (borrower, owner):
        run_until(sim, j, "RUNNING", step=20)

    views = {v.id: v for v in preempt.running_views(sim.plane)}

    assert views[borrower].borrowed is True
    assert views[owner].borrowed is False
