"""The progress endpoint: per-attempt token, first report sets time to useful work."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.preempt import preempt, running_views
from broker.control.reconcile import run_reconcile
from broker.domain import JobState, Reason
from broker.domain.attempts import RunSnapshot
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store.queries import get_job
from broker.store.secrets import progress_token, server_secret
from policies.preemption import Victim
from tests.builders import spec
from tests.harness.sim import Sim, cycle
from tests.harness.statements import statements_sent


def test_progress_reports(sim: Sim) -> None:
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 1
    token = progress_token(server_secret(sim.plane.db, "progress"), job.id, 1)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    url = f"/v1/jobs/{job.id}/progress"
    assert client.post(url, json={"step": 1}).status_code == 401
    assert client.post(url, json={"step": 1}, headers={"Authorization": "Bearer nope"}
                       ).status_code == 401
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post(url, json={"step": 1, "loss": 2}, headers=auth).status_code == 422
    first = client.post(url, json={"step": 10}, headers=auth)
    assert first.status_code == 200 and first.json()["first_useful_work"] is True
    again = client.post(url, json={"step": 20, "checkpoint": "/ckpt/20"}, headers=auth)
    assert again.json() == {"job_id": job.id, "attempt": 1, "step": 20,
                            "first_useful_work": False, "checkpoint": "/ckpt/20"}
    assert client.post(url, json={"step": 30}, headers=auth).status_code == 200
    with sim.plane.db.read() as s:
        row = get_job(s, job.id)
        assert row is not None and row.first_useful_work_at is not None
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and attempt.last_step == 30
    # a report without a checkpoint keeps the last one: path, step and time of the report
    assert (attempt.checkpoint_path, attempt.checkpoint_step) == ("/ckpt/20", 20)
    assert attempt.checkpoint_at is not None and attempt.last_progress_at is not None
    assert attempt.checkpoint_at < attempt.last_progress_at
    shown = client.get(f"/v1/jobs/{job.id}").json()["last_checkpoint"]
    assert (shown["attempt"], shown["path"], shown["step"]) == (1, "/ckpt/20", 20)
    other = submit_job(sim.plane.db, sim.plane.config, spec().build(), "t").job
    wrong_job = client.post(f"/v1/jobs/{other.id}/progress", json={"step": 1}, headers=auth)
    assert wrong_job.status_code == 401  # a token is good for its own job only


def test_metrics_endpoint(sim: Sim) -> None:

    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    for _ in range(3):
        cycle(sim, 40)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    text = client.get("/metrics").text
    assert 'isthmus_transitions_total{from_state="QUEUED",to_state="ADMITTED"}' in text
    assert "isthmus_queue_wait_seconds_bucket" in text
    assert "isthmus_admission_cycle_seconds_count" in text
    assert 'isthmus_backend_reachable{backend="sim-slurm"} 1.0' in text
    with sim.plane.db.read() as s:
        state = get_job(s, job.id)
    assert state is not None
    assert f'isthmus_jobs{{reason="{state.reason}",state="{state.state}"}} 1.0' in text


def test_rendered_objects_never_show_the_progress_token(sim: Sim) -> None:
    from broker.control.dispatch import _request, rendered
    from broker.store import attempts as att

    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    with sim.plane.db.read() as s:
        a = att.attempts_of(s, job.id)[0]
    request = _request(sim.plane, a, "secret-token-value")

    class Renders:
        def render(self, req: object) -> list[dict[str, object]]:
            return [{"kind": "Job", "env": dict(req.env)}]  # type: ignore[attr-defined]

    text = rendered(Renders(), request) or ""
    assert "secret-token-value" not in text and "********" in text and "kind: Job" in text
    assert rendered(object(), request) is None


def test_next_attempt_resumes_from_the_last_reported_checkpoint(sim: Sim) -> None:
    """The reported checkpoint, not the static checkpoint.dir, is where the next attempt
    resumes; preemption weighs the work lost since that checkpoint, not since the last report."""
    body = spec().flavors("h100-80g").set(
        "checkpoint", {"dir": "/ckpt/static", "resumable": True}).build()
    job = submit_job(sim.plane.db, sim.plane.config, body, "t").job
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 1
    sim.advance(60)
    run_reconcile(sim.plane, "sim-slurm")
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    token = progress_token(server_secret(sim.plane.db, "progress"), job.id, 1)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/jobs/{job.id}/progress"
    assert client.post(url, json={"step": 50, "checkpoint": "/ckpt/run/step-50"},
                       headers=auth).status_code == 200
    assert client.post(url, json={"step": 60}, headers=auth).status_code == 200
    with sim.plane.db.read() as s:
        first = att.get_attempt(s, job.id, 1)
    assert first is not None and first.checkpoint_at is not None
    [view] = [v for v in running_views(sim.plane) if v.id == job.id]
    assert view.last_checkpoint_at == first.checkpoint_at != first.last_progress_at

    assert preempt(sim.plane, Victim(job.id, "t", "slurm-h100", 8, 0, 0.0, Reason.Preempted,
                                     "preempted by a test"))
    with sim.plane.db.read() as s:
        row = get_job(s, job.id)
    assert row is not None and row.state == JobState.QUEUED.value
    run_admission(sim.plane)
    with sim.plane.db.read() as s:
        second = att.get_attempt(s, job.id, 2)
    assert second is not None
    snapshot = RunSnapshot.model_validate_json(second.snapshot_json)
    assert snapshot.resume_from == "/ckpt/run/step-50"


def test_without_a_reported_checkpoint_the_static_dir_is_resumed(sim: Sim) -> None:
    body = spec().flavors("h100-80g").set(
        "checkpoint", {"dir": "/ckpt/static", "resumable": True}).build()
    job = submit_job(sim.plane.db, sim.plane.config, body, "t").job
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    assert preempt(sim.plane, Victim(job.id, "t", "slurm-h100", 8, 0, 0.0, Reason.Preempted,
                                     "preempted by a test"))
    run_admission(sim.plane)
    with sim.plane.db.read() as s:
        second = att.get_attempt(s, job.id, 2)
        shown = att.last_checkpoint(s, job.id)
    assert second is not None and shown is None
    assert RunSnapshot.model_validate_json(second.snapshot_json).resume_from == "/ckpt/static"


def test_a_step_report_of_a_job_at_work_is_one_statement(sim: Sim) -> None:
    """Most reports are a step of a job already at work: one UPDATE of the attempt (they were
    four statements: the job row locked, the attempt read, updated, the job's first useful work
    tried). The first report is three: the step tried, the job's first useful work (its row
    locked), the step (it was five: the try and the four). A checkpoint, a wrong token and an
    ended attempt still take the locked path and answer as before."""
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    assert run_dispatch(sim.plane) == 1
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    token = progress_token(server_secret(sim.plane.db, "progress"), job.id, 1)
    url, auth = f"/v1/jobs/{job.id}/progress", {"Authorization": f"Bearer {token}"}

    def sent(body: dict[str, object], code: int) -> list[str]:
        with statements_sent(sim.plane.db.writer) as statements:
            answer = client.post(url, json=body, headers=auth)
        assert answer.status_code == code, answer.text
        verbs = [text.split()[0] for text, _ in statements]
        return [v for v in verbs if v != "BEGIN"]  # SQLite's (BEGIN IMMEDIATE)

    locked = ["SELECT", "SELECT", "UPDATE", "UPDATE"]  # job, attempt; attempt, first work
    assert sent({"step": 10}, 200) == ["UPDATE", "UPDATE", "UPDATE"]  # the first
    with sim.plane.db.read() as s:
        started = get_job(s, job.id)
    assert started is not None and started.first_useful_work_at is not None
    assert sent({"step": 20}, 200) == ["UPDATE"]
    assert sent({"step": 30, "checkpoint": "/ckpt/30"}, 200) == locked
    assert sent({"step": 40}, 200) == ["UPDATE"]
    other = submit_job(sim.plane.db, sim.plane.config, spec().build(), "t").job
    for wrong in ("nope", progress_token(server_secret(sim.plane.db, "progress"), other.id, 1)):
        refused = client.post(url, json={"step": 99}, headers={"Authorization": f"Bearer {wrong}"})
        assert refused.status_code == 401, refused.text  # a job at work: the one-statement try
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and (attempt.last_step, attempt.checkpoint_step) == (40, 30)
    assert preempt(sim.plane, Victim(job.id, "t", "slurm-h100", 8, 0, 0.0, Reason.Preempted,
                                     "preempted by a test"))
    ended = client.post(url, json={"step": 50}, headers=auth)
    assert ended.status_code == 409
    assert ended.json()["type"] == "urn:isthmus:problem:attempt-ended"
    with sim.plane.db.read() as s:
        attempt = att.get_attempt(s, job.id, 1)
    assert attempt is not None and attempt.last_step == 40
