"""The decision log on both databases: a cycle logs the decisions that changed (and every one
after a hand-over), a job's decisions read back with their per-pool verdicts and the cycles
that repeated them, and the control loop prunes cycles past the retention in bounded batches
while the job's current explanation stays."""

from __future__ import annotations

import copy

import pytest
import sqlalchemy as sa

from broker.config import IsthmusConfig, parse_config
from broker.control import decision_log
from broker.control.admission import run_admission
from broker.store import attempts as att
from broker.store.pools import set_drained
from broker.views.decisions import read_cycles, read_job_decisions
from tests.builders import spec
from tests.harness.sim import CONFIG, Sim, submit

RETENTION = 3600.0


@pytest.fixture
def sim_config() -> IsthmusConfig:
    data = copy.deepcopy(CONFIG)
    data["control"] = {"decision_retention": RETENTION, "decision_prune_batch": 2}
    return parse_config(data)


def _count(sim: Sim, table: str) -> int:
    with sim.plane.db.read() as s:
        return int(s.connection().execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def _waiting_job(sim: Sim) -> str:
    """A job whose only pool is drained: it waits with PoolDrained."""
    with sim.plane.db.write() as s:
        set_drained(s, "slurm-h100", True, "maintenance", "ops", sim.clock.now)
    return submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 60)


def test_changes_are_logged_with_verdicts_and_repeats_counted(sim: Sim) -> None:
    job = _waiting_job(sim)
    for _ in range(3):
        run_admission(sim.plane)
        sim.advance(5)
    assert _count(sim, "admission_cycles") == 3
    assert _count(sim, "cycle_decisions") == 1  # unchanged in cycles 2 and 3
    [d] = read_job_decisions(sim.plane.db, job, waiting_until=None)
    assert not d.admitted and d.reason == "PoolDrained", d
    assert [v.pool for v in d.pools] and d.repeated_in == 2 and len(d.inputs_digest) == 16
    cycles = read_cycles(sim.plane.db, limit=10)
    assert [c.decisions_logged for c in cycles] == [0, 0, 1]
    assert cycles[-1].pending == 1 and cycles[-1].reasons == {"PoolDrained": 1}
    sim.plane.soft.decisions_logged = {}  # a new leader: no soft state
    run_admission(sim.plane)
    assert _count(sim, "cycle_decisions") == 2
    newest, older = read_job_decisions(sim.plane.db, job, waiting_until=None)
    assert (newest.repeated_in, older.repeated_in) == (0, 2)
    assert read_job_decisions(sim.plane.db, job, None, limit=1, before_cycle=newest.cycle_id
                              )[0].cycle_id == older.cycle_id


def test_pruning_in_batches_keeps_recent_cycles_and_the_explanation(sim: Sim) -> None:
    job = _waiting_job(sim)
    for _ in range(5):  # 5 old cycles, one logged decision
        run_admission(sim.plane)
        sim.advance(60)
    sim.advance(RETENTION)
    run_admission(sim.plane)  # a recent cycle: the job's decision is logged again (stale)
    assert (_count(sim, "admission_cycles"), _count(sim, "cycle_decisions")) == (6, 2)
    saved = decision_log.PRUNE_MAX_BATCHES
    decision_log.PRUNE_MAX_BATCHES = 1
    try:
        assert decision_log.prune(sim.plane) == 2  # one batch of decision_prune_batch = 2
        assert decision_log.prune(sim.plane) == 2
    finally:
        decision_log.PRUNE_MAX_BATCHES = saved
    assert decision_log.prune(sim.plane) == 1
    assert decision_log.prune(sim.plane) == 0
    assert (_count(sim, "admission_cycles"), _count(sim, "cycle_decisions")) == (1, 1)
    [d] = read_job_decisions(sim.plane.db, job, waiting_until=None)
    assert d.reason == "PoolDrained"
    with sim.plane.db.read() as s:
        explanation = att.get_explanation(s, job)
    assert explanation is not None and "PoolDrained" in explanation[1]


def test_a_run_of_idle_cycles_is_one_row_with_a_count(sim: Sim) -> None:
    """Cycles with no job to decide are stored once: the first's row counts the rest, until a
    cycle has a job to decide; a pruned row is not counted on (a new one is stored)."""
    for _ in range(4):
        run_admission(sim.plane)
        sim.advance(1)
    assert _count(sim, "admission_cycles") == 1
    [idle] = read_cycles(sim.plane.db, limit=10)
    assert (idle.pending, idle.repeats) == (0, 3)
    assert idle.last_at is not None and idle.last_at > idle.at
    job = _waiting_job(sim)
    run_admission(sim.plane)  # a job to decide: a row of its own
    sim.advance(1)
    with sim.plane.db.write() as s:  # the job goes: idle again
        s.connection().execute(sa.text("UPDATE jobs SET state = 'CANCELLED' WHERE id = :j"),
                               {"j": job})
    for _ in range(3):
        run_admission(sim.plane)
        sim.advance(1)
    assert [(c.pending, c.repeats) for c in read_cycles(sim.plane.db, limit=10)] == [
        (0, 2), (1, 0), (0, 3)]
    sim.advance(RETENTION + 10)
    assert decision_log.prune(sim.plane) == 3
    run_admission(sim.plane)  # the row it counted on is gone: a new one
    assert [(c.pending, c.repeats) for c in read_cycles(sim.plane.db, limit=10)] == [(0, 0)]
