"""The control plane's caches are declared (broker.control.soft_state), each bounded: nothing
is hung on the plane by the passes, and the specs cache drops the least recently used."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta

import pytest

from broker.control import soft_state
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.control.soft_state import SoftState
from broker.orchestration.submission import cancel_job
from broker.store import attempts as att
from broker.store.queries import get_job
from tests.builders import SpecBuilder, spec
from tests.harness.sim import Sim, attempts_of, cycle, run_until, submit


def test_the_passes_keep_their_state_only_in_declared_fields(sim: Sim) -> None:
    jobs = [submit(sim, spec().name(f"j{i}").flavors("a100-80g").replicas(1).topology(None),
                   60) for i in range(3)]
    for j in jobs:
        run_until(sim, j, "SUCCEEDED", step=20)
    cycle(sim, 30)
    declared = {f.name for f in fields(ControlPlane)} | {"_inventories", "_gates"}
    assert set(vars(sim.plane)) <= declared, set(vars(sim.plane)) - declared
    assert set(vars(sim.plane.soft)) == {f.name for f in fields(SoftState)}
    assert sim.plane.soft.views is not None  # the admission pass did use its cache


def test_the_specs_cache_keeps_the_most_recently_used(sim: Sim,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soft_state, "SPECS_MAX", 3)
    plane = sim.plane
    plane.soft = SoftState()
    text = spec().name("x").flavors("a100-80g").build().model_dump_json()
    for i in range(10):
        plane.spec(f"job-{i}", text)
    assert len(plane.soft.specs) == 3
    assert set(plane.soft.specs) == {"job-7", "job-8", "job-9"}


def test_preemption_views_read_each_live_attempts_snapshot_and_spec_once(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """The views preemption plans from are built again whenever a job asks; an attempt's
    snapshot, spec and reservation never change, so they are read and parsed once per attempt
    (SoftState.victim_views), and only the times that move (a checkpoint) are read again:
    the views are those built from scratch. An ended attempt drops out."""
    from broker.control import preempt

    jobs = [submit(sim, spec().name(f"v{i}").flavors("a100-80g").replicas(2).gpus(4)
                   .topology(None), 600) for i in range(2)]
    for j in jobs:
        run_until(sim, j, "RUNNING", step=10)
    parsed = count_snapshot_parses(monkeypatch)
    first = preempt.running_views(sim.plane)
    assert len(parsed) == 2 and {v.id for v in first} == set(jobs)
    assert all(len(v.nodes) == 2 for v in first)
    assert preempt.running_views(sim.plane) == first
    assert len(parsed) == 2  # not parsed again

    checkpoint = sim.clock.now - timedelta(minutes=1)
    with sim.plane.db.write() as s:  # a progress report with a checkpoint
        att.update(s, jobs[0], 1, last_progress_at=checkpoint, checkpoint_at=checkpoint)
    moved = {v.id: v for v in preempt.running_views(sim.plane)}
    assert len(parsed) == 2  # the new time is read, the snapshot is not parsed again
    assert moved[jobs[0]].last_checkpoint_at == checkpoint
    assert moved[jobs[1]] == next(v for v in first if v.id == jobs[1])
    sim.plane.soft.victim_views = None
    assert {v.id: v for v in preempt.running_views(sim.plane)} == moved  # built afresh
    assert len(parsed) == 4
    assert set(kept_views(sim)) == {(j, 1) for j in jobs}
    sim.plane.config = sim.plane.config.model_copy()  # a new configuration: built again
    assert {v.id: v for v in preempt.running_views(sim.plane)} == moved
    assert len(parsed) == 6

    cancel_job(sim.plane.db, jobs[1], "tester", by_admin=False)
    assert {v.id for v in preempt.running_views(sim.plane)} == {jobs[0]}
    assert set(kept_views(sim)) == {(jobs[0], 1)}


def kept_views(sim: Sim) -> dict[tuple[str, int], object]:
    kept = sim.plane.soft.victim_views
    assert kept is not None
    return kept[1]


def test_the_specs_cache_holds_live_jobs_only(sim: Sim) -> None:
    """A job that ends drops out of the specs cache (its spec is not read again), as does a
    waiting job cancelled through the API (which never meets the reconciler), and the queue
    estimate's read of ended attempts (the run-time model) does not bring them back: over a
    week of jobs the cache holds what is live, not the last SPECS_MAX jobs."""
    done = [submit(sim, spec().name(f"d{i}").flavors("a100-80g").replicas(1).topology(None),
                   30) for i in range(3)]
    for j in done:
        run_until(sim, j, "SUCCEEDED", step=10)
    live = submit(sim, spec().name("live").flavors("a100-80g").replicas(1).topology(None), 600)
    run_until(sim, live, "RUNNING", step=10)
    waiting = submit(sim, spec().name("wait").flavors("a100-80g").replicas(8).gpus(8)
                     .topology(None), 60)
    cancelled = submit(sim, spec().name("gone").flavors("a100-80g").replicas(8).gpus(8)
                       .topology(None), 60)
    cycle(sim, 10)  # an admission cycle with a waiting job: the estimate reads the ended ones
    assert sim.plane.soft.runtime_model is not None
    assert set(sim.plane.soft.specs) == {live, waiting, cancelled}
    cancel_job(sim.plane.db, cancelled, "tester", by_admin=False)  # the API's cancel
    cycle(sim, 10)
    assert set(sim.plane.soft.specs) == {live, waiting}


def test_a_run_snapshot_is_parsed_once_from_dispatch_to_its_run(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch parses an attempt's run snapshot and keeps it (SoftState.snapshots); the
    reconciler's first sight of the run uses it and takes it out, so that the cache holds
    only the attempts between the two; the job's end drops any left."""
    parsed = count_snapshot_parses(monkeypatch)
    job = submit(sim, spec().name("once").flavors("a100-80g").replicas(1).topology(None)
                 .backend("k8s"), 120)
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    assert set(sim.plane.soft.snapshots) == {(job, 1)}
    assert len(parsed) == 1
    sim.advance(30)
    run_reconcile(sim.plane, "sim-k8s")
    assert state_of(sim, job) == "RUNNING"
    assert len(parsed) == 1  # the run's resolved facts came from the kept snapshot
    assert not sim.plane.soft.snapshots  # taken out: not kept for the run
    cancelled = submit(sim, spec().name("never").flavors("a100-80g").replicas(1)
                       .topology(None).backend("k8s"), 120)
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    assert (cancelled, 1) in sim.plane.soft.snapshots
    cancel_job(sim.plane.db, cancelled, "tester", by_admin=False)
    sim.advance(10)
    run_reconcile(sim.plane, "sim-k8s")  # sends the cancel, ends the attempt
    assert (cancelled, 1) not in sim.plane.soft.snapshots  # its job ended: dropped
    assert cancelled not in sim.plane.soft.specs


def state_of(sim: Sim, job_id: str) -> str:
    with sim.plane.db.read() as s:
        job = get_job(s, job_id)
    assert job is not None
    return job.state


def test_every_per_job_cache_is_empty_once_every_job_has_ended(sim: Sim) -> None:
    """A leak detector: jobs that succeed, fail once and go again, are cancelled while
    queued, right after their dispatch and while running; once all have ended and the loop
    has passed again, no cache keyed by job or attempt holds any of them (the run-time
    model's facts excepted: eta_facts keeps the ended attempts it learns from, bounded; and
    running_ends, replaced only by a pass that estimates, that is with a job waiting)."""
    def one(name: str, replicas: int = 1) -> SpecBuilder:
        return spec().name(name).flavors("a100-80g").replicas(replicas).gpus(8) \
            .topology(None).backend("k8s")

    done = [submit(sim, one(f"ok{i}"), 60) for i in range(3)]
    failing = submit(sim, one("flaky").set("annotations", {"isthmus.io/sim-fail": "node-loss"}),
                     60)
    running = submit(sim, one("long"), 3600)
    cycle(sim, 10)
    queued = submit(sim, one("wide", replicas=8), 60)  # waits: the pool is busy
    cycle(sim, 10)
    dispatched = submit(sim, one("brief"), 60)
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    for j in (queued, dispatched, running):
        cancel_job(sim.plane.db, j, "tester", by_admin=False)
    for j in [*done, failing]:
        run_until(sim, j, "SUCCEEDED", step=20)
    assert len(attempts_of(sim, failing)) == 2
    for _ in range(3):
        cycle(sim, 10)
    soft = sim.plane.soft
    held = {name: len(getattr(soft, name)) for name in (
        "specs", "snapshots", "waiting", "placed_nodes", "estimated", "decisions_logged")}
    held["told"] = sum(len(v) for v in soft.told.values())
    held["victim_views"] = len(soft.victim_views[1]) if soft.victim_views else 0
    assert held == dict.fromkeys(held, 0)


def test_the_eta_facts_keep_only_what_the_next_passes_read(sim: Sim) -> None:
    """The run-time facts of attempts are kept for the queue estimate: each learning of the
    run-time model keeps those of the ended attempts it learnt from and of the attempts
    running at the last pass, and drops the others (they are never read again: at 100 jobs/s
    they were ~1.5 MB a minute until the bound emptied them). A what-if (another thread, and
    on a replica that does not lead, no last pass to go by) leaves them as they are."""
    from broker.control import eta_inputs

    done = [submit(sim, spec().name(f"e{i}").flavors("a100-80g").replicas(1).topology(None),
                   30) for i in range(2)]
    for j in done:
        run_until(sim, j, "SUCCEEDED", step=10)
    live = submit(sim, spec().name("elive").flavors("a100-80g").replicas(1).topology(None), 600)
    run_until(sim, live, "RUNNING", step=10)
    submit(sim, spec().name("ewait").flavors("a100-80g").replicas(8).gpus(8).topology(None), 60)
    cycle(sim, 10)  # a waiting job: the estimate reads the running attempts
    assert (live, 1) in sim.plane.soft.running_ends
    sim.plane.soft.eta_facts[("long-gone", 1)] = ("vision", 60.0, (), 8)
    with sim.plane.db.read() as s:
        eta_inputs.runtime_model(sim.plane, s)  # a what-if's: keeps everything
    assert ("long-gone", 1) in sim.plane.soft.eta_facts
    with sim.plane.db.read() as s:
        eta_inputs.runtime_model(sim.plane, s, prune=True)  # the real cycle's
    assert set(sim.plane.soft.eta_facts) == {(j, 1) for j in [*done, live]}


def count_snapshot_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that grows by one entry per run snapshot parsed from now on."""
    from broker.domain.attempts import RunSnapshot

    parsed: list[str] = []
    original = RunSnapshot.model_validate_json

    def counting(text: str | bytes, **kwargs: object) -> RunSnapshot:
        parsed.append("x")
        return original(text)

    monkeypatch.setattr(RunSnapshot, "model_validate_json", counting)
    return parsed
