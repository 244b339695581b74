"""The metrics of a reconcile chunk (transitions, GPU-seconds charged, failures) are counted
once the chunk's transaction committed (broker.control.reconcile_apply, broker.store.batch
deferred, effects held): a chunk that fails counts nothing, and the next pass counts each once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.metrics import REGISTRY
from broker.store import batch
from tests.builders import spec
from tests.harness.sim import Sim, attempts_of, consistent, state, submit
from tests.integration.control.poison import poison_snapshot


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the counters a reconcile pass moves."""
    names = ("isthmus_transitions_total", "isthmus_gpu_seconds_total",
             "isthmus_attempt_failures_total", "isthmus_cost_total")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in REGISTRY.collect() for s in m.samples
            if s.name in names}


def _delta(before: dict[Any, float], after: dict[Any, float], name: str,
           **labels: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items()
               if k[0] == name and labels.items() <= dict(k[1]).items())


def test_a_chunk_that_fails_at_its_commit_counts_nothing(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = [submit(sim, spec().name(f"m{i}").flavors("a100-80g").replicas(1).gpus(8)
                   .topology(None).backend("k8s"), 600) for i in range(3)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(30)
    run_reconcile(sim.plane, "sim-k8s")
    assert [state(sim, j)[0] for j in jobs] == ["RUNNING"] * 3
    k8s = sim.backends["sim-k8s"]
    k8s.fail_node(k8s.jobs[attempts_of(sim, jobs[0])[-1].backend_name].nodes[0])
    sim.advance(700)  # the others succeed
    original = batch.deferred
    failed = {"n": 0}

    @contextlib.contextmanager
    def failing(session: Any, *, effects: bool = True) -> Iterator[batch.Deferred]:
        with original(session, effects=effects) as held:
            yield held
        failed["n"] += 1  # every attempt applied, then the transaction fails
        raise sa.exc.OperationalError("COMMIT", {}, Exception("the connection was lost"))

    monkeypatch.setattr(batch, "deferred", failing)
    before = _samples()
    with pytest.raises(sa.exc.OperationalError):
        run_reconcile(sim.plane, "sim-k8s")
    assert failed["n"] == 1
    assert _samples() == before
    assert [state(sim, j)[0] for j in jobs] == ["RUNNING"] * 3
    monkeypatch.setattr(batch, "deferred", original)
    run_reconcile(sim.plane, "sim-k8s")
    after = _samples()
    assert [state(sim, j)[0] for j in jobs[1:]] == ["SUCCEEDED"] * 2
    assert _delta(before, after, "isthmus_transitions_total",
                  from_state="RUNNING", to_state="SUCCEEDED") == 2
    assert _delta(before, after, "isthmus_attempt_failures_total") == 1
    # three attempts of 8 GPUs, each charged once: about 730 s of the two that succeeded
    used = _delta(before, after, "isthmus_gpu_seconds_total", kind="used")
    assert 2 * 8 * 600 <= used <= 3 * 8 * 800
    consistent(sim)


def test_an_attempt_rolled_back_inside_a_chunk_counts_nothing(sim: Sim) -> None:
    jobs = [submit(sim, spec().name(f"r{i}").flavors("a100-80g").replicas(1).gpus(2)
                   .topology(None).backend("k8s"), 600) for i in range(4)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    broken = jobs[1]
    poison_snapshot(sim, broken, gang__replicas="many")  # fails after its transition to RUNNING
    sim.advance(30)
    before = _samples()
    run_reconcile(sim.plane, "sim-k8s")
    after = _samples()
    assert state(sim, broken)[1] == "InternalError"
    assert [state(sim, j)[0] for j in jobs if j != broken] == ["RUNNING"] * 3
    assert _delta(before, after, "isthmus_transitions_total", to_state="RUNNING") == 3
