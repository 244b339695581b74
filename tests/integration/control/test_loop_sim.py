"""The control loop over simulated backends: submit -> admit -> dispatch -> reconcile -> end,
with retries, preemption, cancellation, outages and crash recovery."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from backends.sim.backend import DURATION_ENV
from backends.slurm import SlurmBackend, SlurmSettings
from backends.slurm.containers import ContainerSettings
from backends.slurm.inventory import SlurmPoolBinding
from backends.slurm.transport_cli import CliTransport
from broker import ledger
from broker.config import IsthmusConfig, parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.orchestration.submission import cancel_job
from broker.store import attempts as att
from broker.store.queries import get_job, job_events
from tests.builders import SpecBuilder, spec
from tests.harness.sim import CONFIG, Sim, attempts_of, consistent, cycle, run_until, state, submit


def test_jobs_run_to_success_on_both_backends(sim: Sim) -> None:
    h100 = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8))
    a100 = submit(sim, spec().flavors("a100-80g").replicas(4).gpus(8).backend("k8s"))
    cycle(sim, 1)
    assert state(sim, h100)[0] in ("PREPARING", "RUNNING")
    for _ in range(12):
        cycle(sim, 10)
    assert state(sim, h100) == ("SUCCEEDED", "Succeeded")
    assert state(sim, a100) == ("SUCCEEDED", "Succeeded")
    with sim.plane.db.read() as s:
        path = [e.to_state for e in job_events(s, h100)]
        assert path[:3] == ["SUBMITTED", "VALIDATING", "QUEUED"]
        assert "ADMITTED" in path and "RUNNING" in path and path[-1] == "SUCCEEDED"
        assert ledger.usage(s)[("vision", "h100-80g")] == (0, 0)
    consistent(sim)


def test_infra_failure_is_retried_elsewhere_and_user_error_is_not(sim: Sim) -> None:
    job = submit(sim, spec().flavors("a100-80g").replicas(1).gpus(8).topology(None), 300)
    run_until(sim, job, "RUNNING", step=20)
    first = attempts_of(sim, job)[-1]
    node = sim.backends["sim-k8s"].jobs[first.backend_name].nodes[0]
    sim.backends["sim-k8s"].fail_node(node)
    cycle(sim, 1)
    job_state, reason = state(sim, job)
    assert job_state == "QUEUED" and reason == "BackoffAfterFailure"
    with sim.plane.db.read() as s:
        path = [(e.to_state, e.reason) for e in job_events(s, job)]
    assert ("FAILED", "InfraTransient") in path and ("RETRYING", "RetryScheduled") in path
    sim.advance(60)  # past the 30 s backoff
    run_until(sim, job, "RUNNING", step=20)
    second = attempts_of(sim, job)[-1]
    assert second.number == 2
    assert node not in sim.backends["sim-k8s"].jobs[second.backend_name].nodes
    consistent(sim)


def test_user_error_ends_failed_without_retry(sim: Sim) -> None:
    from broker.domain.facts import Phase

    job = submit(sim, spec().flavors("a100-80g").replicas(1).gpus(8).topology(None), 300)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    backend = sim.backends["sim-k8s"]
    from broker.domain import FailureCategory, Reason

    backend._end(backend.jobs[a.backend_name], Phase.FAILED, Reason.UserError,
                 "exit code 3", FailureCategory.USER_ERROR)
    cycle(sim, 1)
    assert state(sim, job) == ("FAILED", "UserError")
    assert len(attempts_of(sim, job)) == 1
    with sim.plane.db.read() as s:
        assert ledger.usage(s)[("vision", "a100-80g")] == (0, 0)
    consistent(sim)


def test_preempted_job_is_requeued_without_spending_an_attempt(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    sim.backends["sim-slurm"].preempt(a.backend_name)
    cycle(sim, 1)
    with sim.plane.db.read() as s:
        path = [(e.to_state, e.reason) for e in job_events(s, job)]
    assert ("RETRYING", "Preempted") in path
    run_until(sim, job, "RUNNING", step=20)
    assert [x.preempted for x in attempts_of(sim, job)] == [True, False]
    consistent(sim)


def test_infra_retry_avoids_only_the_node_the_backend_blamed(sim: Sim) -> None:
    import json

    job = submit(sim, spec().flavors("a100-80g").replicas(2).gpus(8).topology(None), 300)
    run_until(sim, job, "RUNNING", step=20)
    first = attempts_of(sim, job)[-1]
    gang = sim.backends["sim-k8s"].jobs[first.backend_name].nodes
    bad, healthy = gang[0], gang[1]
    sim.backends["sim-k8s"].fail_node(bad)
    cycle(sim, 1)
    with sim.plane.db.read() as s:
        row = get_job(s, job)
        assert row is not None
        assert json.loads(row.exclude_json or "{}")["nodes"] == [bad]  # not the healthy one
        assert f"avoiding node {bad}" in row.message and healthy not in row.message
    consistent(sim)


def test_cancel_while_running_cancels_the_backend_object(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    cancel_job(sim.plane.db, job, "tester", by_admin=False)
    cycle(sim, 1)
    assert sim.backends["sim-slurm"].jobs[a.backend_name].phase.value == "CANCELLED"
    assert attempts_of(sim, job)[-1].ended_at is not None
    consistent(sim)


def test_backend_outage_is_a_reason_not_a_failure(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 120)
    run_until(sim, job, "RUNNING", step=20)
    sim.backends["sim-slurm"].reachable = False
    for _ in range(8):  # 80 s of outage, longer than the lost-attempt grace
        cycle(sim, 10)
        assert state(sim, job) == ("RUNNING", "BackendUnavailable")
    sim.backends["sim-slurm"].reachable = True
    run_until(sim, job, "SUCCEEDED")
    consistent(sim)


def test_dispatch_after_a_crash_adopts_instead_of_duplicating(sim: Sim) -> None:
    from broker.control.dispatch import _request
    from broker.store.secrets import progress_token, server_secret

    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 60)
    run_admission(sim.plane)
    a = attempts_of(sim, job)[-1]
    assert a.dispatch == "pending"
    # the previous leader created the object, then died before recording it
    token = progress_token(server_secret(sim.plane.db, "progress"), job, a.number)
    sim.backends["sim-slurm"].submit(_request(sim.plane, a, token))
    assert run_dispatch(sim.plane) == 1
    names = [n for n in sim.backends["sim-slurm"].jobs if n.startswith("isthmus-")]
    assert names == [a.backend_name]
    with sim.plane.db.read() as s:
        assert "adopted" in job_events(s, job)[-1].message
    run_until(sim, job, "SUCCEEDED")
    consistent(sim)


def test_lost_attempt_fails_as_orchestration_and_is_retried_once(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    del sim.backends["sim-slurm"].jobs[a.backend_name]  # the backend forgot it entirely
    for _ in range(4):  # within the 60 s grace: not yet lost
        cycle(sim, 10)
        assert state(sim, job)[0] == "RUNNING"
    for _ in range(10):  # past the grace, then the 30 s backoff
        cycle(sim, 10)
    with sim.plane.db.read() as s:
        path = [(e.to_state, e.reason) for e in job_events(s, job)]
    assert ("FAILED", "Orchestration") in path
    assert len(attempts_of(sim, job)) == 2
    consistent(sim)


def test_orphan_objects_are_cancelled(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8), 600)
    run_until(sim, job, "RUNNING", step=20)
    a = attempts_of(sim, job)[-1]
    with sim.plane.db.write() as s:  # e.g. an attempt the database ended by hand
        att.update(s, job, a.number, ended_at=sim.clock.now)
    cycle(sim, 1)
    assert sim.backends["sim-slurm"].jobs[a.backend_name].phase.value == "CANCELLED"


def test_higher_priority_preempts_and_the_victim_resumes_from_its_checkpoint(sim: Sim) -> None:
    from broker.domain.attempts import RunSnapshot

    def low(team: str) -> SpecBuilder:
        return spec().name(f"low-{team}").team(team).flavors("h100-80g").replicas(2).topology(
            None).set("priority", "low").set(
            "checkpoint", {"dir": f"/ckpt/{team}", "resumable": True, "grace": "30s"})

    # the pool (32 GPUs) is full of low-priority work: vision's own and language's borrowed
    lows = [submit(sim, low("vision"), 3600), submit(sim, low("language"), 3600)]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)  # past the 10 min minimum runtime that protects new work
    urgent = submit(sim, spec().name("urgent").flavors("h100-80g").replicas(2).topology(None)
                    .set("priority", "high"), 60)
    for _ in range(6):
        cycle(sim, 10)
        if state(sim, urgent)[0] in ("RUNNING", "SUCCEEDED"):
            break
    with sim.plane.db.read() as s:
        u = get_job(s, urgent)
    assert state(sim, urgent)[0] in ("RUNNING", "SUCCEEDED"), (u.reason, u.message) if u else None
    preempted = []
    with sim.plane.db.read() as s:
        for j in lows:
            if ("RETRYING", "Preempted") in [(e.to_state, e.reason) for e in job_events(s, j)]:
                preempted.append(j)
    assert len(preempted) == 1, "exactly one victim frees the 16 GPUs needed"
    victim = preempted[0]
    run_until(sim, victim, "RUNNING", cycles=40, step=20)
    attempts = attempts_of(sim, victim)
    assert [a.preempted for a in attempts] == [True, False]
    resumed = RunSnapshot.model_validate_json(attempts[-1].snapshot_json)
    assert resumed.resume_from is not None and resumed.resume_from.startswith("/ckpt/")
    consistent(sim)


def _high_across_teams() -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    raw["priority_classes"] = [
        {"name": "low", "value": 0}, {"name": "normal", "value": 100},
        {"name": "high", "value": 1000, "preempting": True, "preempt_across_teams": True},
    ]
    return parse_config(raw)


@pytest.mark.parametrize("sim_config", [_high_across_teams()])
def test_priority_preemption_frees_one_rack_for_a_rack_bound_gang(sim: Sim) -> None:
    from broker.domain.attempts import RunSnapshot

    # k8s-a100 (two racks of four 8-GPU nodes) is full of vision's 1 x 8 jobs, inside
    # vision's own quota, one low-priority job per rack; language's urgent 2 x 8 gang (of a
    # class that may preempt across teams) must run within one rack, so stopping the two
    # low-priority jobs (by GPU count the cheapest choice) would not let it run
    lows = []
    for i, priority in enumerate(["normal"] * 3 + ["low"] + ["normal"] * 3 + ["low"]):
        j = submit(sim, spec().name(f"{priority}-{i}").flavors("a100-80g").replicas(1)
                   .topology(None).set("priority", priority), 3600)
        run_until(sim, j, "RUNNING", step=20)
        lows.append(j)
    cycle(sim, 700)  # past the minimum runtime that protects new work
    urgent = submit(sim, spec().name("urgent").team("language").flavors("a100-80g")
                    .replicas(2).topology("rack").set("priority", "high"), 60)
    run_admission(sim.plane)
    assert state(sim, urgent) == ("QUEUED", "WaitingForPreemption")
    run_until(sim, urgent, "RUNNING", cycles=6)
    with sim.plane.db.read() as s:
        preempted = [j for j in lows if ("RETRYING", "Preempted")
                     in [(e.to_state, e.reason) for e in job_events(s, j)]]
    assert len(preempted) == 2, "two victims, exactly enough"
    rack = {n.name: n.topology.rack for p in sim.plane.inventory().pools for n in p.nodes}
    racks: set[str | None] = set()
    for j in preempted:
        placement = RunSnapshot.model_validate_json(attempts_of(sim, j)[0].snapshot_json).placement
        assert placement is not None
        racks.update(rack[n] for n in placement.nodes)
    assert len(racks) == 1, racks
    assert sorted(j in (lows[3], lows[7]) for j in preempted) == [False, True]
    consistent(sim)


def test_a_team_whose_quota_is_full_preempts_its_own_lower_priority_work(sim: Sim) -> None:
    # vision's 32 nominal h100 GPUs (all the pool has; nobody lends it more) run two of its
    # own low-priority gangs; its urgent job must take the place of one of them
    def low(i: int) -> SpecBuilder:
        return spec().name(f"low-{i}").team("vision").flavors("h100-80g").replicas(2).topology(
            None).set("priority", "low")

    lows = [submit(sim, low(i), 3600) for i in range(2)]
    for j in lows:
        run_until(sim, j, "RUNNING", step=20)
    cycle(sim, 700)  # past the minimum runtime that protects new work
    urgent = submit(sim, spec().name("urgent").team("vision").flavors("h100-80g").replicas(2)
                    .topology(None).set("priority", "high"), 60)
    run_admission(sim.plane)
    assert state(sim, urgent) == ("QUEUED", "WaitingForPreemption")
    run_until(sim, urgent, "RUNNING", cycles=6)
    with sim.plane.db.read() as s:
        why = {j: [e.message for e in job_events(s, j)
                   if (e.to_state, e.reason) == ("RETRYING", "Preempted")] for j in lows}
    preempted = [j for j, msgs in why.items() if msgs]
    assert len(preempted) == 1, "one 16-GPU victim makes room inside the team's quota"
    assert "team vision's h100-80g quota is full" in why[preempted[0]][0]
    run_until(sim, preempted[0], "RUNNING", cycles=20, step=20)  # after urgent ends
    assert [a.preempted for a in attempts_of(sim, preempted[0])] == [True, False]
    consistent(sim)


def test_admitted_but_undispatched_capacity_is_not_given_twice(sim: Sim) -> None:
    from broker.domain.attempts import RunSnapshot

    nodes: list[str] = []
    for i in range(4):  # slurm-h100 has 4 nodes of 8: four 1x8 gangs, each its own node
        job = submit(sim, spec().name(f"one-{i}").flavors("h100-80g").replicas(1)
                     .topology(None), 60)
        run_admission(sim.plane)  # no dispatch and no reconcile in between
        a = attempts_of(sim, job)[-1]
        placement = RunSnapshot.model_validate_json(a.snapshot_json).placement
        assert placement is not None
        nodes += placement.nodes
    assert len(set(nodes)) == 4, nodes
    fifth = submit(sim, spec().name("fifth").flavors("h100-80g").replicas(1).topology(None), 60)
    run_admission(sim.plane)
    assert state(sim, fifth)[0] == "QUEUED"


def test_objects_of_other_installations_are_left_alone(sim: Sim) -> None:
    from backends.base import SubmitRequest
    from broker.domain.attempts import Placement, RunSnapshot
    from broker.domain.spec import BackendKind

    s = spec().flavors("h100-80g").replicas(1).topology(None).build()
    placement = Placement(backend=BackendKind.SLURM, backend_instance="sim-slurm",
                          pool="slurm-h100", flavor="h100-80g")
    foreign = "isthmus-zzzzzzzzzzzzzzzz-1"  # a job id this database never saw
    sim.backends["sim-slurm"].submit(SubmitRequest(
        job_id="zzzzzzzzzzzzzzzz", attempt=1, name=foreign,
        snapshot=RunSnapshot.of(s), placement=placement, env={DURATION_ENV: "600"}))
    cycle(sim, 10)
    assert sim.backends["sim-slurm"].jobs[foreign].phase.value == "RUNNING"


SBATCH_REFUSAL = ("sbatch: error: Batch job submission failed: "
                  "Requested node configuration is not available")


def _refusing_slurm(tmp_path: Path) -> SlurmBackend:
    """The real Slurm adapter and CLI transport over stand-in commands: no job of that name is
    queued or accounted, and sbatch refuses the job the way Slurm does (exit 1, the error on
    stderr), which the transport turns into SubmitRefused."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    commands = {"squeue": "exit 0", "sacct": "exit 0", "sinfo": "echo '{\"nodes\": []}'",
                "sbatch": f"cat >/dev/null; echo '{SBATCH_REFUSAL}' >&2; exit 1"}
    for name, body in commands.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return SlurmBackend("sim-slurm", [SlurmPoolBinding("slurm-h100", "h100", "h100-80g")],
                        SlurmSettings(work_dir=str(tmp_path / "jobs"),  # runs images
                                      container=ContainerSettings(runtime="pyxis")),
                        CliTransport(bin_dir=str(bin_dir)))


def test_refused_dispatch_avoids_the_pool_instead_of_looping(
    sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusing = _refusing_slurm(tmp_path)
    monkeypatch.setattr(sim.backends["sim-slurm"], "submit", refusing.submit)
    job = submit(sim, spec().flavors("h100-80g").replicas(1).topology(None), 60)
    for _ in range(10):
        cycle(sim, 10)
    attempts = attempts_of(sim, job)
    assert len(attempts) == 1 and attempts[0].dispatch == "abandoned"
    assert attempts[0].pool == "slurm-h100"
    job_state, reason = state(sim, job)
    assert job_state == "QUEUED" and reason in ("PoolExcluded", "NoFlavorFits"), reason
    with sim.plane.db.read() as s:
        refusal = [e for e in job_events(s, job) if e.reason == "DispatchRefused"]
    assert refusal and "Requested node configuration is not available" in refusal[0].message


def test_usage_and_waste_are_accounted_per_attempt(sim: Sim) -> None:
    import sqlalchemy as sa

    job = submit(sim, spec().flavors("a100-80g").replicas(1).topology(None), 600)
    run_until(sim, job, "RUNNING", step=20)
    cycle(sim, 120)
    first = attempts_of(sim, job)[-1]
    node = sim.backends["sim-k8s"].jobs[first.backend_name].nodes[0]
    sim.backends["sim-k8s"].fail_node(node)
    cycle(sim, 1)
    with sim.plane.db.read() as s:
        rows = s.connection().execute(sa.text(
            "SELECT kind, gpu_hours, cost, note FROM ledger_entries WHERE job_id = :j"
            " AND attempt = 1 AND kind NOT IN ('reserve', 'release')"), {"j": job}).all()
    kinds = {r[0]: (r[1], r[2], r[3]) for r in rows}
    assert {"usage", "waste:failed"} <= set(kinds) <= {"usage", "waste:preparing", "waste:failed"}
    used = kinds["usage"][0]
    wasted = sum(v[0] for k, v in kinds.items() if k.startswith("waste:"))
    # a failed attempt wastes all it held: the time preparing plus its whole run
    assert used > 0 and abs(wasted - used) < 1e-9
    assert kinds["usage"][1] == used  # a100-80g and k8s-a100 both weigh 1
    assert kinds["usage"][2].startswith("failed")


def test_fair_share_history_comes_from_the_ledger_and_survives_a_restart(sim: Sim) -> None:
    """Fair-share usage is the decayed average of the ledger's reservations: a restarted plane
    (or another replica after a hand-over) sees the same history and orders teams alike."""
    from datetime import timedelta

    from broker import ledger
    from broker.control.plane import ControlPlane
    from broker.domain import JobState
    from broker.policy_inputs import quota_config
    from broker.policy_inputs import usage as usage_view
    from policies.ordering import FairShare
    from tests.builders import insert_job_in_state

    t0 = sim.clock.now
    half = sim.plane.params.fair_share_half_life_s
    with sim.plane.db.write() as s:
        old = insert_job_in_state(s, JobState.SUCCEEDED)
        new = insert_job_in_state(s, JobState.RUNNING)
        # vision held 32 GPUs from two half-lives ago to one half-life ago, then released them
        ledger.reserve(s, ledger.Reservation(old, 1, "vision", "h100-80g", 32),
                       t0 - timedelta(seconds=2 * half))
        ledger.release(s, old, 1, t0 - timedelta(seconds=half))
        # language has held 16 GPUs for one half-life, still does
        ledger.reserve(s, ledger.Reservation(new, 1, "language", "a100-80g", 16),
                       t0 - timedelta(seconds=half))
    in_use = {("language", "a100-80g"): 16}
    first = sim.plane.decayed_usage(in_use, t0)
    assert first[("vision", "h100-80g")] == pytest.approx(32 * (0.5 - 0.25))
    assert first[("language", "a100-80g")] == pytest.approx(16 * (1 - 0.5))
    restarted = ControlPlane(sim.plane.db, sim.plane.config, sim.backends,
                             clock=lambda: sim.clock.now, params=sim.plane.params)
    assert restarted.decayed_usage(in_use, t0) == first
    quotas = quota_config(sim.plane.config)

    def order(decayed: dict[tuple[str, str], float]) -> list[str]:
        fair = FairShare(quotas, usage_view(in_use, decayed))
        return sorted(("vision", "language"), key=fair.share)

    assert order(first) == order(restarted.decayed_usage(in_use, t0)) == ["vision", "language"]
    # one more half-life with nothing new: vision's history halves, language's grows to 3/4
    later = restarted.decayed_usage(in_use, t0 + timedelta(seconds=half))
    assert later[("vision", "h100-80g")] == pytest.approx(4.0)
    assert later[("language", "a100-80g")] == pytest.approx(12.0)
