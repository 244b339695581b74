"""Accounting that adds up: over a mixed workload on the simulated federation (successes, a
user error, an infrastructure failure and its retry, a lost attempt, a preemption by the
backend and one by Isthmus, cancels while running and while queued), the ledger charges every
GPU-hour the attempts held exactly once, with waste by kind and a numeric cost."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

from broker import ledger
from broker.config import IsthmusConfig, parse_config
from broker.domain import FailureCategory, Reason
from broker.domain.facts import Phase
from broker.orchestration.submission import cancel_job
from broker.store import attempts as att
from tests.builders import SpecBuilder, spec
from tests.harness.sim import CONFIG, Sim, attempts_of, cycle, run_until, state, submit

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
H100_WEIGHT, SLURM_POOL_WEIGHT = 2.0, 1.5  # flavor and pool cost weights of slurm-h100


@pytest.fixture
def sim_config() -> IsthmusConfig:
    data = copy.deepcopy(CONFIG)
    data["pools"][0]["cost_weight"] = SLURM_POOL_WEIGHT
    return parse_config(data)


def _held_hours(a: att.AttemptRecord) -> float:
    """GPU-hours an attempt held: from its backend object's creation to its end."""
    if a.dispatch != att.CREATED:
        return 0.0
    assert a.ended_at is not None, f"{a.backend_name} has not ended"
    since = a.dispatched_at or a.created_at
    return a.gpus * (a.ended_at - since).total_seconds() / 3600


def _entries(sim: Sim) -> list[sa.Row[tuple[str, int, str, str, float, float | None]]]:
    with sim.plane.db.read() as s:
        return list(s.connection().execute(sa.text(
            "SELECT job_id, attempt, kind, flavor, gpu_hours, cost FROM ledger_entries"
            " WHERE kind NOT IN ('reserve', 'release')")).all())


def _until(sim: Sim, done: Callable[[], bool], cycles: int = 200, step: float = 60) -> None:
    for _ in range(cycles):
        if done():
            return
        cycle(sim, step)
    raise AssertionError("the workload did not finish")


@pytest.mark.slow
def test_the_ledger_charges_every_held_gpu_hour_once_whatever_the_ending(sim: Sim) -> None:
    k8s = sim.backends["sim-k8s"]
    a100 = spec().flavors("a100-80g").topology(None)
    jobs: dict[str, str] = {}

    # 1. Isthmus preempts: the h100 pool (32 GPUs) full of low-priority work, then an urgent job
    def low(team: str) -> SpecBuilder:
        return spec().name(f"low-{team}").team(team).flavors("h100-80g").replicas(2).topology(
            None).set("priority", "low").set(
            "checkpoint", {"dir": f"/ckpt/{team}", "resumable": True, "grace": "30s"})

    jobs["low-vision"] = submit(sim, low("vision"), 1800)
    jobs["low-language"] = submit(sim, low("language"), 1800)
    for name in ("low-vision", "low-language"):
        run_until(sim, jobs[name], "RUNNING", step=20)
    # 2. on the a100 pool meanwhile: success, user error, infra failure, lost, preempted by the
    # backend, cancelled while running after a progress report
    jobs["ok"] = submit(sim, a100.name("ok").replicas(1).gpus(8), 900)
    jobs["user-error"] = submit(sim, a100.name("user-error").replicas(1).gpus(8), 3600)
    jobs["node-lost"] = submit(sim, a100.name("node-lost").replicas(1).gpus(8), 1200)
    jobs["forgotten"] = submit(sim, a100.name("forgotten").replicas(1).gpus(4), 3600)
    jobs["bumped"] = submit(sim, a100.name("bumped").replicas(1).gpus(8), 600)
    jobs["cancelled"] = submit(sim, a100.name("cancelled").replicas(1).gpus(8), 3600)
    for name in ("ok", "user-error", "node-lost", "forgotten", "bumped", "cancelled"):
        run_until(sim, jobs[name], "RUNNING", step=20)
    cycle(sim, 700)  # past the 10 minutes that protect new work from preemption

    urgent = submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 300)
    jobs["urgent"] = urgent
    _until(sim, lambda: state(sim, urgent)[0] in ("RUNNING", "SUCCEEDED"), step=10)

    def current(name: str) -> att.AttemptRecord:
        return attempts_of(sim, jobs[name])[-1]

    k8s._end(k8s.jobs[current("user-error").backend_name], Phase.FAILED, Reason.UserError,
             "OOMKilled: exit code 137", FailureCategory.USER_ERROR)
    k8s.fail_node(k8s.jobs[current("node-lost").backend_name].nodes[0])
    k8s._end(k8s.jobs[current("forgotten").backend_name], Phase.LOST, Reason.Orchestration,
             "unknown to queue and accounting", FailureCategory.ORCHESTRATION)
    k8s.preempt(current("bumped").backend_name)
    with sim.plane.db.write() as s:  # a progress report with a checkpoint five minutes ago
        c = current("cancelled")
        at = sim.clock.now - timedelta(minutes=5)
        att.update(s, c.job_id, c.number, last_progress_at=at, checkpoint_at=at,
                   checkpoint_path="/ckpt/cancelled/step-1", checkpoint_step=1)
    cancel_job(sim.plane.db, jobs["cancelled"], "tester", by_admin=False)
    jobs["queued-cancel"] = submit(sim, spec().name("never-ran").flavors("h100-80g")
                                   .replicas(4).topology(None), 60)
    cancel_job(sim.plane.db, jobs["queued-cancel"], "admin", by_admin=True)

    _until(sim, lambda: all(state(sim, j)[0] in TERMINAL for j in jobs.values()))

    attempts = [a for j in jobs.values() for a in attempts_of(sim, j)]
    entries = _entries(sim)
    usage = {(e.job_id, e.attempt): e for e in entries if e.kind == "usage"}
    held = sum(_held_hours(a) for a in attempts)
    charged = sum(e.gpu_hours for e in usage.values())
    print(f"ledger usage {charged:.4f} GPU-h vs held intervals {held:.4f} GPU-h "
          f"over {len(attempts)} attempts")
    assert held > 0 and abs(charged - held) <= 0.01 * held

    # each attempt that held GPUs is charged once, and nothing else is
    created = {(a.job_id, a.number) for a in attempts if a.dispatch == att.CREATED}
    assert set(usage) == created
    for a in attempts:
        if a.dispatch == att.CREATED:
            assert usage[(a.job_id, a.number)].gpu_hours == pytest.approx(_held_hours(a))
    with sim.plane.db.read() as s:
        assert ledger.uncharged_attempts(s) == 0
        assert ledger.check(s) == []

    # waste: a part of usage, split by kind; every ending of this workload shows up
    waste: dict[str, float] = {}
    for e in entries:
        if e.kind.startswith("waste:"):
            waste[e.kind] = waste.get(e.kind, 0.0) + e.gpu_hours
            assert e.gpu_hours <= usage[(e.job_id, e.attempt)].gpu_hours + 1e-9
    assert {"waste:failed", "waste:lost", "waste:preempted", "waste:cancelled"} <= set(waste)
    # cancelled after a checkpoint: only the 8 GPUs' time since that checkpoint is lost
    c = current("cancelled")
    assert c.ended_at is not None and c.checkpoint_at is not None
    cancelled = [e for e in entries if (e.job_id, e.attempt, e.kind)
                 == (c.job_id, c.number, "waste:cancelled")]
    since_report = 8 * (c.ended_at - c.checkpoint_at).total_seconds() / 3600
    assert cancelled and cancelled[0].gpu_hours == pytest.approx(since_report)
    assert since_report < usage[(c.job_id, c.number)].gpu_hours / 2
    # preempted by Isthmus: one low-priority attempt ended preempted, and was charged
    victims = [a for name in ("low-vision", "low-language") for a in attempts_of(sim, jobs[name])
               if a.preempted]
    assert len(victims) == 1 and (victims[0].job_id, victims[0].number) in usage
    # the queued job that was cancelled held nothing and is charged nothing
    assert not [e for e in entries if e.job_id == jobs["queued-cancel"]]

    # cost: hours x flavor weight x pool weight, in the ledger as a number
    for e in entries:
        weight = H100_WEIGHT * SLURM_POOL_WEIGHT if e.flavor == "h100-80g" else 1.0
        assert e.cost == pytest.approx(e.gpu_hours * weight)


def test_charging_twice_books_nothing_more(sim: Sim) -> None:
    from broker.control.reconcile import charge

    job = submit(sim, spec().flavors("a100-80g").replicas(1).gpus(8).topology(None), 3600)
    run_until(sim, job, "RUNNING", step=20)
    cycle(sim, 600)
    a = attempts_of(sim, job)[-1]
    with sim.plane.db.write() as s:
        assert charge(s, sim.plane, "vision", a, ledger.Ending.CANCELLED, sim.clock.now,
                      sim.clock.now)
        # a second path seeing another ending of the same attempt adds nothing
        assert not charge(s, sim.plane, "vision", a, ledger.Ending.FAILED, sim.clock.now,
                          sim.clock.now)
    kinds = [e.kind for e in _entries(sim) if e.job_id == job]
    assert sorted(kinds) == ["usage", "waste:cancelled"]
