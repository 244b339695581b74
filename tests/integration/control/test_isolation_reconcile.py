"""Issue 11: one attempt's exception while its facts are applied does not stop the others of
the pass; an unexpected error of a backend's observe is a reason on its jobs, not a crash."""

from __future__ import annotations

from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.reconcile import run_reconcile
from broker.store import attempts as att
from tests.builders import spec
from tests.harness.sim import Sim, consistent, run_until, state, submit
from tests.integration.control.poison import events, poison, poison_snapshot


def test_one_attempt_that_cannot_be_applied_does_not_stop_the_pass(sim: Sim) -> None:
    broken = submit(sim, spec().name("broken").flavors("a100-80g").replicas(1).topology(None),
                    600)
    run_until(sim, broken, "RUNNING", step=20)
    others = [submit(sim, spec().name(f"o{i}").team("language").flavors("a100-80g")
                     .replicas(1).topology(None), 600) for i in range(2)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    poison(sim, broken, raw="{")  # its retry needs the spec, which no longer parses
    with sim.plane.db.read() as s:
        a = att.attempts_of(s, broken)[-1]
    k8s = sim.backends["sim-k8s"]
    k8s.fail_node(k8s.jobs[a.backend_name].nodes[0])
    sim.advance(30)
    report = run_reconcile(sim.plane, "sim-k8s")  # raised ValidationError
    for j in others:
        assert state(sim, j)[0] in ("PREPARING", "RUNNING")
    assert state(sim, broken) == ("FAILED", "InfraTransient")  # the failure itself is kept
    assert report.transitions >= 2


def test_an_unexpected_observe_error_is_a_reason_on_that_backends_jobs(sim: Sim) -> None:
    slurm = submit(sim, spec().name("s").flavors("h100-80g").replicas(1).topology(None), 600)
    k8s = submit(sim, spec().name("k").flavors("a100-80g").replicas(1).topology(None), 600)
    for j in (slurm, k8s):
        run_until(sim, j, "RUNNING", step=20)

    def observe(names: object = None) -> list[object]:
        raise KeyError("a bug in the adapter")

    sim.backends["sim-slurm"].observe = observe  # type: ignore[method-assign,assignment]
    report = run_reconcile(sim.plane, "sim-slurm")  # raised KeyError
    assert report.unreachable
    assert state(sim, slurm) == ("RUNNING", "BackendUnavailable")
    assert "observe (KeyError); correlation id" in events(sim, slurm)[-1][2]
    run_reconcile(sim.plane, "sim-k8s")
    assert state(sim, k8s) == ("RUNNING", "Running")
    del sim.backends["sim-slurm"].observe  # the adapter's own again
    run_reconcile(sim.plane, "sim-slurm")
    assert state(sim, slurm) == ("RUNNING", "Running")  # the reason does not stick
    consistent(sim)


def test_an_attempt_that_fails_inside_a_chunk_is_rolled_back_alone(sim: Sim) -> None:
    """The changed attempts of a pass share one transaction (reconcile_apply.APPLY_CHUNK),
    each in its own savepoint: one that raises while its facts are applied leaves no write
    behind (not even its fact), is marked, and is applied by a later pass once it can be; the
    others of the chunk are applied."""
    jobs = [submit(sim, spec().name(f"c{i}").flavors("a100-80g").replicas(1).gpus(2)
                   .topology(None).backend("k8s"), 600) for i in range(4)]
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    broken = jobs[1]
    with sim.plane.db.read() as s:
        before = att.attempts_of(s, broken)[-1]
    poison_snapshot(sim, broken, gang__replicas="many")  # its first observation cannot parse it
    sim.advance(30)
    report = run_reconcile(sim.plane, "sim-k8s")
    for j in jobs:
        if j != broken:
            assert state(sim, j)[0] == "RUNNING"
    assert state(sim, broken)[1] == "InternalError"
    assert "reconcile (ValidationError)" in events(sim, broken)[-1][2]
    with sim.plane.db.read() as s:
        after = att.attempts_of(s, broken)[-1]
    assert (after.phase, after.started_at, after.last_seen_at) == (
        before.phase, before.started_at, before.last_seen_at)  # its savepoint was undone
    assert report.transitions >= len(jobs) - 1  # each of the others moved
    with sim.plane.db.write() as s:  # mended: the next pass applies it
        att.update(s, broken, after.number, snapshot_json=before.snapshot_json)
    run_reconcile(sim.plane, "sim-k8s")
    assert state(sim, broken)[0] == "RUNNING"
    consistent(sim)
