"""A user's hold on a queued job (scontrol hold / release, sbatch --hold): it waits QUEUED with
JobHeldUser until released, takes no part in admission, and a hold that commits after the
cycle decided to admit the job still keeps it (the admission is dropped under the lock)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control import admission_writes as writes
from broker.control.admission import cycle_inputs, decide
from broker.orchestration.user_holds import hold_job
from tests.builders import spec
from tests.harness.sim import Sim, cycle, run_until, state, submit


def _job(sim: Sim, name: str) -> str:
    return submit(sim, spec().name(name).flavors("h100-80g").replicas(1).gpus(8)
                  .topology(None), 60)


def test_a_held_job_waits_until_released_and_others_go_on(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    held, other = _job(sim, "held"), _job(sim, "other")
    r = client.post(f"/v1/jobs/{held}/hold")
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["reason"]) == ("QUEUED", "JobHeldUser")
    assert "scontrol release" in r.json()["message"]
    for _ in range(3):
        cycle(sim, 10)
    assert state(sim, held) == ("QUEUED", "JobHeldUser")
    assert state(sim, other)[0] in ("RUNNING", "SUCCEEDED")
    assert client.post(f"/v1/jobs/{held}/hold").status_code == 200  # held twice: the same
    r = client.post(f"/v1/jobs/{held}/release")
    assert r.status_code == 200 and r.json()["reason"] == "WaitingForAdmission", r.text
    run_until(sim, held, "RUNNING", step=10)
    refused = client.post(f"/v1/jobs/{held}/hold")  # Slurm holds pending jobs only
    assert refused.status_code == 409 and "only a queued job" in refused.json()["detail"]
    assert client.post("/v1/jobs/0000000000000000/hold").status_code == 404


def test_a_hold_after_the_cycle_decided_still_keeps_the_job(sim: Sim) -> None:
    job = _job(sim, "raced")
    now = sim.plane.clock()
    inputs = cycle_inputs(sim.plane, now)
    result, estimates = decide(sim.plane, inputs)
    assert [d.job_id for d in result.decisions if d.admitted] == [job]
    hold_job(sim.plane.db, job, "alice")  # commits between the decision and its write
    writes.persist(sim.plane, list(result.decisions), {j.id: j for j in inputs.queued}, now,
                   estimates)
    assert state(sim, job) == ("QUEUED", "JobHeldUser")
    for _ in range(2):
        cycle(sim, 10)
    assert state(sim, job) == ("QUEUED", "JobHeldUser")


def test_a_held_job_takes_no_room_from_the_others(sim: Sim) -> None:
    """The cycle leaves a held job out before placement: a held gang as large as the pool,
    queued first, does not keep a later job from being admitted in the same cycle."""
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    pool = sim.plane.inventory().pools[0]
    whole = submit(sim, spec().name("whole").flavors(pool.flavor).replicas(len(pool.nodes))
                   .gpus(8).topology(None), 60)
    assert client.post(f"/v1/jobs/{whole}/hold").status_code == 200
    later = submit(sim, spec().name("later").flavors(pool.flavor).replicas(1).gpus(8)
                   .topology(None), 60)
    cycle(sim, 10)
    assert state(sim, whole) == ("QUEUED", "JobHeldUser")
    assert state(sim, later)[0] not in ("QUEUED",), state(sim, later)
