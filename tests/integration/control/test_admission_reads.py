"""An admission cycle reads its inputs in one read transaction: the pools' drain states with
the queue and the usage (a transaction of their own every cycle before), and still honours a
drain committed since the last cycle."""

from __future__ import annotations

import pytest

from broker.control.admission import run_admission
from broker.store.pools import set_drained
from tests.builders import spec
from tests.harness.sim import Sim, state, submit
from tests.harness.statements import transactions_opened


def _drain(sim: Sim, drained: bool) -> None:
    with sim.plane.db.write() as s:
        set_drained(s, "slurm-h100", drained, "maintenance", "ops", sim.clock.now)


def test_a_cycle_reads_its_inputs_drains_included_in_one_transaction(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _drain(sim, True)
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 60)
    reads = transactions_opened(sim.plane.db, "read", monkeypatch)
    run_admission(sim.plane)
    assert reads[0] == 1
    assert state(sim, job)[1] == "PoolDrained"
    _drain(sim, False)  # seen by the next cycle
    sim.advance(5)
    reads[0] = 0
    run_admission(sim.plane)
    assert reads[0] == 1
    assert state(sim, job)[0] == "ADMITTED"
