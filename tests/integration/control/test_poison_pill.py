"""Issue 11: the poison-pill test on simulated backends. A job whose stored spec says
max_runtime 1e12 s holds GPUs where a higher-priority job needs preemption, a job whose
dispatch fails unexpectedly on every backend, and ordinary jobs of two teams: every ordinary
job runs, the bad ones carry a clear reason, and the books stay consistent."""

from __future__ import annotations

from backends.base import SubmitRequest, SubmitResult
from backends.sim.backend import SimBackend
from tests.builders import SpecBuilder, spec
from tests.harness.sim import Sim, consistent, cycle, run_until, state, submit
from tests.integration.control.poison import events, poison


def _explode_for(backend: SimBackend, job_id: str) -> None:
    original = backend.submit

    def submit_or_explode(request: SubmitRequest) -> SubmitResult:
        if getattr(request, "job_id", None) == job_id:
            raise RuntimeError("cannot render this job")
        return original(request)

    backend.submit = submit_or_explode  # type: ignore[method-assign]


def test_poison_pills_harm_nobody_else(sim: Sim) -> None:
    def low(team: str) -> SpecBuilder:
        return spec().name(f"low-{team}").team(team).flavors("h100-80g").replicas(2).topology(
            None).set("priority", "low")

    # slurm-h100 is full: vision's own gang and language's borrowed one
    holder, borrower = submit(sim, low("vision"), 7200), submit(sim, low("language"), 7200)
    for j in (holder, borrower):
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)  # past the minimum runtime that protects new work
    poison(sim, holder, max_runtime=10**12)

    bomb = submit(sim, spec().name("bomb").flavors("a100-80g", "h100-80g").replicas(1)
                  .topology(None), 600)
    for backend in sim.backends.values():
        _explode_for(backend, bomb)
    urgent = submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 600)  # needs a victim in slurm-h100
    ordinary = [
        submit(sim, spec().name(f"{team}-{i}").team(team).flavors("a100-80g").replicas(1)
               .topology(None), 600)
        for team, n in (("vision", 3), ("language", 2)) for i in range(n)
    ]
    for _ in range(12):
        cycle(sim, 10)
        if all(state(sim, j)[0] == "RUNNING" for j in [urgent, *ordinary]):
            break
    for j in [urgent, *ordinary]:
        assert state(sim, j)[0] == "RUNNING", (j, state(sim, j), events(sim, j)[-1])
    assert state(sim, holder)[0] == "RUNNING"  # a pill is not punished either
    bomb_state, bomb_reason = state(sim, bomb)
    assert bomb_state == "QUEUED"
    assert bomb_reason in ("InternalError", "BackoffAfterFailure", "PoolExcluded"), bomb_reason
    failures = [m for (_, r, m) in events(sim, bomb) if r == "InternalError"]
    assert failures and all("dispatch (RuntimeError); correlation id" in m for m in failures)
    consistent(sim)  # no quota held for the bomb, nothing lost
