"""Issue 11, finding 1: a job with an absurd stored duration must not stop admission (nor its
own retry); a job whose stored spec cannot be read waits with InternalError, alone."""

from __future__ import annotations

from datetime import UTC

import pytest

from broker.control.admission import run_admission
from broker.store import attempts as att
from broker.store.queries import get_job
from tests.builders import SpecBuilder, spec
from tests.harness.sim import Sim, cycle, run_until, state, submit
from tests.integration.control.poison import events, poison


def _low(team: str) -> SpecBuilder:
    return spec().name(f"low-{team}").team(team).flavors("h100-80g").replicas(2).topology(
        None).set("priority", "low")


def test_a_running_job_with_a_huge_max_runtime_does_not_stop_preemption_planning(
    sim: Sim,
) -> None:
    lows = [submit(sim, _low("vision"), 3600), submit(sim, _low("language"), 3600)]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    poison(sim, lows[0], max_runtime=10**12)  # 31,700 years; past the API, never trusted
    cycle(sim, 700)  # past the minimum runtime that protects new work
    urgent = submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 60)
    other = submit(sim, spec().name("other").team("language").flavors("a100-80g").replicas(1)
                   .topology(None).backend("k8s"), 60)
    run_admission(sim.plane)  # raised OverflowError: date value out of range
    assert state(sim, other) == ("ADMITTED", "Admitted")
    assert state(sim, urgent) == ("QUEUED", "WaitingForPreemption")


def test_a_retry_backoff_at_its_ceiling_is_applied_not_lost(sim: Sim) -> None:
    """The spec caps backoff at a day (a stored 1e12 s can no longer be read, see the test
    below); the retry engine's answer at that ceiling is applied, never lost to arithmetic
    (timebox.add_seconds saturates beyond it, tests/unit/domain/test_timebox.py)."""
    job = submit(sim, spec().flavors("a100-80g").replicas(1).gpus(8).topology(None), 300)
    run_until(sim, job, "RUNNING", step=20)
    poison(sim, job, retry__backoff=86400, retry__max_backoff=86400)
    with sim.plane.db.read() as s:
        a = att.attempts_of(s, job)[-1]
    sim.backends["sim-k8s"].fail_node(sim.backends["sim-k8s"].jobs[a.backend_name].nodes[0])
    cycle(sim, 1)
    assert state(sim, job) == ("QUEUED", "BackoffAfterFailure")
    with sim.plane.db.read() as s:
        row = get_job(s, job)
        assert row is not None and row.not_before is not None
        not_before = row.not_before.replace(tzinfo=row.not_before.tzinfo or UTC)
        wait = (not_before - sim.clock.now).total_seconds()
        assert 86000 < wait <= 86400


def test_a_job_whose_stored_spec_cannot_be_read_waits_alone_with_internal_error(
    sim: Sim,
) -> None:
    bad = submit(sim, spec().name("bad").flavors("a100-80g").replicas(1).topology(None), 60)
    good = [submit(sim, spec().name(f"good-{t}").team(t).flavors("a100-80g").replicas(1)
                   .topology(None), 60) for t in ("vision", "language")]
    poison(sim, bad, raw='{"api_version": "isthmus/v1", "team": ')  # truncated
    run_admission(sim.plane)
    for j in good:
        assert state(sim, j) == ("ADMITTED", "Admitted")
    assert state(sim, bad) == ("QUEUED", "InternalError")
    message = events(sim, bad)[-1][2]
    assert "correlation id" in message and "admission view" in message
    run_admission(sim.plane)  # the same failure again: the same message, no new event
    assert events(sim, bad)[-1][2] == message
    assert sum(1 for e in events(sim, bad) if e[1] == "InternalError") == 1


def test_a_preemption_plan_that_fails_for_one_job_is_no_plan_for_that_job_alone(
    sim: Sim, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from policies.preemption import Preemptor

    lows = [submit(sim, _low("vision"), 3600), submit(sim, _low("language"), 3600)]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)
    broken = submit(sim, spec().name("broken").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 60)
    other = submit(sim, spec().name("other").team("language").flavors("a100-80g").replicas(1)
                   .topology(None).backend("k8s"), 60)
    original = Preemptor.plan

    def plan(self: Preemptor, job: object, *args: object, **kwargs: object) -> object:
        if getattr(job, "id", None) == broken:
            raise ZeroDivisionError("a bug met only by this job")
        return original(self, job, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Preemptor, "plan", plan)
    run_admission(sim.plane)
    assert state(sim, other) == ("ADMITTED", "Admitted")
    assert state(sim, broken) == ("QUEUED", "QuotaExhausted")  # as without a plan
