"""scontrol requeue / requeuehold (POST /v1/jobs/{id}/requeue): a running job's attempt is
stopped and the job goes back to the queue under the same id, then runs again; not a failure
and not a preemption (a job allowed one attempt is requeued more times than the retry policy
would allow preemptions); requeuehold leaves it held; a waiting or ended job is refused."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control.reconcile import run_reconcile
from broker.store import requeue_requests
from policies.retry import RetryParams
from tests.builders import spec
from tests.harness.sim import Sim, attempts_of, consistent, cycle, run_until, state, submit
from tests.integration.control.poison import events


def _job(sim: Sim, name: str, duration: float = 600) -> str:
    return submit(sim, spec().name(name).flavors("h100-80g").replicas(1).gpus(8)
                  .topology(None).set("retry", {"max_attempts": 1}), duration)


def test_a_requeued_job_runs_again_under_its_id_more_often_than_retries_allow(
        sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    job = _job(sim, "requeued")
    times = RetryParams().max_preemptions + 1  # beyond what preemption may do to a job
    for n in range(1, times + 1):
        run_until(sim, job, "RUNNING", step=10)
        r = client.post(f"/v1/jobs/{job}/requeue")
        assert r.status_code == 202, r.text
        cycle(sim, 1)  # the cycle stops the attempt and requeues the job
        assert state(sim, job) == ("QUEUED", "Requeued"), (n, events(sim, job)[-3:])
    run_until(sim, job, "SUCCEEDED", step=60)
    ended = attempts_of(sim, job)
    assert len(ended) == times + 1
    assert all(a.failure is None and not a.preempted for a in ended)
    moves = [(to, reason) for to, reason, _ in events(sim, job)]
    assert moves.count(("RETRYING", "Requeued")) == times
    assert any("requeued by" in m for _, _, m in events(sim, job))
    consistent(sim)


def test_requeuehold_leaves_the_job_held_until_released(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    job = _job(sim, "requeue-held")
    run_until(sim, job, "RUNNING", step=10)
    assert client.post(f"/v1/jobs/{job}/requeue", params={"hold": "true"}).status_code == 202
    for _ in range(3):
        cycle(sim, 10)
    assert state(sim, job) == ("QUEUED", "JobHeldUser")
    assert client.post(f"/v1/jobs/{job}/release").status_code == 200
    run_until(sim, job, "RUNNING", step=10)
    assert len(attempts_of(sim, job)) == 2
    consistent(sim)


def test_a_waiting_or_ended_job_is_refused_and_nothing_is_recorded(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    pool = sim.plane.inventory().pools[0]
    whole = submit(sim, spec().name("whole").flavors(pool.flavor).replicas(len(pool.nodes))
                   .gpus(8).topology(None), 600)
    waiting = submit(sim, spec().name("waiting").flavors(pool.flavor).replicas(1).gpus(8)
                     .topology(None), 60)
    run_until(sim, whole, "RUNNING", step=10)
    r = client.post(f"/v1/jobs/{waiting}/requeue")
    assert r.status_code == 409 and "pending execution" in r.json()["detail"], r.text
    client.post(f"/v1/jobs/{whole}/cancel")
    run_until(sim, whole, "CANCELLED")
    r = client.post(f"/v1/jobs/{whole}/requeue")
    assert r.status_code == 409 and "submit it again" in r.json()["detail"], r.text
    with sim.plane.db.read() as s:
        assert requeue_requests.pending(s) == []
    assert client.post("/v1/jobs/0000000000000000/requeue").status_code == 404


def test_a_request_whose_job_ended_meanwhile_is_dropped(sim: Sim) -> None:
    """The job ended on its own between the request and the cycle: nothing is requeued."""
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    job = _job(sim, "short", duration=60)
    run_until(sim, job, "RUNNING", step=10)
    assert client.post(f"/v1/jobs/{job}/requeue").status_code == 202
    sim.advance(120)
    for name in sim.backends:
        run_reconcile(sim.plane, name)
    assert state(sim, job)[0] == "SUCCEEDED"
    cycle(sim, 1)
    assert state(sim, job)[0] == "SUCCEEDED"
    with sim.plane.db.read() as s:
        assert requeue_requests.pending(s) == []
    consistent(sim)
