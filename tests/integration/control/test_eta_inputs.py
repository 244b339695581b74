"""The queue estimate's inputs read from the store (broker/control/eta_inputs.py): the run-time
model learns from the attempts that ended, and running attempts are known by their placed
nodes, declared end and predicted end."""

from __future__ import annotations

import json
from datetime import timedelta

from broker.control.admission import cycle_inputs
from broker.control.eta_inputs import running_work, runtime_model
from policies.run_length import MIN_SAMPLES
from tests.builders import spec
from tests.harness.sim import Sim, attempts_of, cycle, run_until, submit


def test_ended_attempts_teach_the_model_their_team_limit_and_size(sim: Sim) -> None:
    """MIN_SAMPLES one-GPU jobs declaring an hour that run 6 minutes: the model then predicts
    an hour-long job of that team at a tenth of its limit (the declared hour before), from the
    group of one-GPU jobs of that limit."""
    builder = spec().flavors("a100-80g").replicas(1).gpus(1).topology(None).set("max_runtime", 3600)
    ids = [submit(sim, builder, duration=360) for _ in range(MIN_SAMPLES)]
    with sim.plane.db.read() as s:
        assert runtime_model(sim.plane, s).run_s("vision", 3600) == 3600
    for job_id in ids:
        run_until(sim, job_id, "SUCCEEDED", cycles=60, step=30)
    with sim.plane.db.read() as s:
        model = runtime_model(sim.plane, s)
    assert model.samples == MIN_SAMPLES
    assert len(model.groups[("d", "3600", "g", "1")]) == MIN_SAMPLES  # the gang's GPUs were read
    predicted = model.run_s("vision", 3600)
    assert 300 <= predicted <= 480, predicted  # 6 minutes, give or take the cycle steps


def test_running_attempts_are_known_by_their_nodes_and_ends(sim: Sim) -> None:
    job_id = submit(sim, spec().flavors("a100-80g").replicas(2).gpus(8).topology(None)
                    .set("max_runtime", 7200), duration=5000)
    run_until(sim, job_id, "RUNNING", cycles=20, step=10)
    cycle(sim, 60)
    (attempt,) = attempts_of(sim, job_id)
    assert attempt.started_at is not None
    with sim.plane.db.read() as s:
        model = runtime_model(sim.plane, s)
        work = running_work(sim.plane, s, model, sim.plane.clock())
    placed = set(json.loads(attempt.snapshot_json)["placement"]["nodes"])
    assert {r.node for r in work} == placed and len(placed) == 2
    for r in work:
        assert r.declared_end == attempt.started_at + timedelta(seconds=7200)
        # no history: expected at its declared end
        assert r.predicted_end == r.declared_end


def test_a_what_if_leaves_the_real_cycles_kept_ends_as_they_were(sim: Sim) -> None:
    """`isthmus plan` (a what-if, `fold_usage=False`) learns a model of its own; its look at
    the running work must not replace the ends the real cycle keeps for its next one (they
    would all be predicted again)."""
    job_id = submit(sim, spec().flavors("a100-80g").replicas(2).gpus(8).topology(None)
                    .set("max_runtime", 7200), duration=5000)
    run_until(sim, job_id, "RUNNING", cycles=20, step=10)
    with sim.plane.db.read() as s:
        running_work(sim.plane, s, runtime_model(sim.plane, s), sim.plane.clock())
    kept = sim.plane.soft.running_ends
    assert set(kept) == {(job_id, 1)}
    cycle_inputs(sim.plane, sim.plane.clock(), fold_usage=False)
    assert sim.plane.soft.running_ends is kept
