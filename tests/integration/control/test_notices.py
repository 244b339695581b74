"""Notices (issue 33): every notable job event reaches a local webhook receiver and a local
mail server, on both databases; the outbox row is written with the event (a rolled-back
change leaves none); a receiver that fails N times then succeeds gets the notice once; one
that always fails ends in the dead-letter view (API and CLI)."""

from __future__ import annotations

import copy
import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.control.notices import NOTICE_HEADER, SIGNATURE_HEADER, run_notices
from broker.domain import JobState, Reason
from broker.orchestration import approval
from broker.orchestration.rules import Cause
from broker.orchestration.submission import cancel_job
from broker.orchestration.transitions import set_state
from broker.store import notices as store
from tests.builders import spec
from tests.harness import audit
from tests.harness.notice_sinks import Mailbox, Receiver
from tests.harness.sim import CONFIG, Sim, cycle, make_sim, run_until, state, submit

SECRET = "s3cret-for-tests"
SECRET_ENV = "ISTHMUS_TEST_NOTICE_SECRET"


@pytest.fixture(autouse=True)
def _signing_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


def _config(url: str, smtp_port: int | None, **notices: Any) -> IsthmusConfig:
    raw = copy.deepcopy(CONFIG)
    raw["priority_classes"] = [
        {"name": "low", "value": 0}, {"name": "normal", "value": 100},
        {"name": "high", "value": 1000, "preempting": True},
        {"name": "urgent", "value": 100, "approval": "required"},
    ]
    for team in raw["teams"]:
        if team["name"] == "vision":
            team["notices"] = {"webhooks": [url], "emails": ["ops@example.org"]}
    raw["notices"] = {"backoff": 5, "max_backoff": 60, "signing_secret_env": SECRET_ENV,
                      **notices}
    if smtp_port is not None:
        raw["notices"]["smtp"] = {"host": "127.0.0.1", "port": smtp_port,
                                  "sender": "isthmus@example.org"}
    return parse_config(raw)


def _deliver(sim: Sim, rounds: int = 1, gap: float = 0.0) -> None:
    for _ in range(rounds):
        run_notices(sim.plane)
        sim.advance(gap)


def _until_notice(sim: Sim, job_id: str, kind: str, step: float = 20) -> None:
    """Cycle until the job has a notice of this kind in the outbox (RETRYING, for one, lasts
    no longer than the pass that requeues the job)."""
    for _ in range(30):
        with sim.plane.db.read() as s:
            if any(n.kind == kind and n.job_id == job_id for n in store.unexpanded(s, 10_000)):
                return
        cycle(sim, step)
    raise AssertionError(f"no {kind} notice for {job_id}; it is {state(sim, job_id)}")


def _every_kind(sim: Sim) -> dict[str, str]:
    """Drive jobs of team vision through every notable event; the job of each kind."""
    jobs: dict[str, str] = {}
    # started, succeeded
    jobs["succeeded"] = ok = submit(sim, spec().name("ok").flavors("a100-80g").replicas(1)
                                    .topology(None), 60)
    run_until(sim, ok, "SUCCEEDED", step=20)
    # failed (USER_ERROR, not retried)
    jobs["failed"] = oom = submit(sim, spec().name("oom").flavors("a100-80g").replicas(1)
                                  .topology(None).set("annotations",
                                                      {"isthmus.io/sim-fail": "oom"}), 600)
    run_until(sim, oom, "FAILED", step=20)
    # requeued (a lost node: FAILED, then RETRYING)
    jobs["requeued"] = lost = submit(sim, spec().name("lost").flavors("a100-80g").replicas(1)
                                     .topology(None).set("annotations",
                                                         {"isthmus.io/sim-fail": "node-loss"}),
                                     600)
    _until_notice(sim, lost, "requeued")
    # cancelled
    jobs["cancelled"] = gone = submit(sim, spec().name("gone").flavors("a100-80g").replicas(1)
                                      .topology(None), 600)
    cancel_job(sim.plane.db, gone, "tester", by_admin=False)
    # approval needed, then decided
    jobs["approval_needed"] = urgent = submit(
        sim, spec().name("urgent").flavors("a100-80g").replicas(1).topology(None)
        .set("priority", "urgent"), 60)
    cycle(sim, 10)
    assert state(sim, urgent) == ("QUEUED", "AwaitingApproval")
    approval.decide(sim.plane.db, sim.plane.config, urgent, "approve", "ada", "deadline")
    jobs["approval_decided"] = urgent
    # preempted: a low job holds the whole H100 pool; a high one of the same team arrives
    jobs["preempted"] = low = submit(sim, spec().name("low").flavors("h100-80g").replicas(4)
                                     .topology(None).set("priority", "low"), 3600)
    run_until(sim, low, "RUNNING", step=20)
    cycle(sim, 700)  # past the minimum run time before preemption
    submit(sim, spec().name("high").flavors("h100-80g").replicas(4).topology(None)
           .set("priority", "high"), 60)
    _until_notice(sim, low, "preempted", step=10)
    # budget_threshold: no budgets yet; the hook a budget check will call
    with sim.plane.db.write() as s:
        store.add(s, key="budget:vision:2026-11:80", kind="budget_threshold", team="vision",
                  at=sim.clock.now, details={"threshold_pct": 80, "period": "2026-11"})
    return jobs


ALL = ["approval_decided", "approval_needed", "budget_threshold", "cancelled", "failed",
       "preempted", "requeued", "started", "succeeded"]


def test_every_kind_reaches_the_webhook_and_the_mail_server(
        db: Any, receiver: Receiver, mailbox: tuple[Mailbox, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    box, port = mailbox
    sim = make_sim(db, _config(receiver.url, port))
    jobs = _every_kind(sim)
    _deliver(sim)
    assert sorted(set(receiver.kinds())) == ALL
    assert sorted(set(box.kinds())) == ALL
    by_kind = {(body["kind"], body["job_id"]): (body, headers, raw)
               for body, headers, raw in receiver.accepted}
    for kind, job in jobs.items():
        body, headers, raw = by_kind[kind, job]
        assert body["team"] == "vision" and body["job_number"]
        assert {"job_name", "state", "reason", "message", "time"} <= set(body)
        want = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        assert headers[SIGNATURE_HEADER] == want
        assert headers[NOTICE_HEADER] == body["notice_id"]
    failed = [b for b, _, _ in receiver.accepted if b["kind"] == "failed"]
    assert {b["failure_category"] for b in failed} == {"USER_ERROR", "INFRA_TRANSIENT"}
    preempted = by_kind["preempted", jobs["preempted"]][0]
    assert (preempted["state"], preempted["reason"]) == ("RETRYING", "Preempted")
    assert preempted["grace_left_s"] == 120  # the spec's default checkpoint grace
    assert by_kind["approval_decided", jobs["approval_decided"]][0]["reason"] == "Approved"
    assert by_kind["started", jobs["succeeded"]][0]["state"] == "RUNNING"
    assert by_kind["budget_threshold", None][0]["threshold_pct"] == 80
    # one notice per event, one delivery per target: nothing is sent twice
    keys = [b["notice_id"] for b, _, _ in receiver.accepted]
    assert len(keys) == len(set(keys))
    assert len(box.messages) == len(receiver.accepted)
    assert all(rcpt == ["ops@example.org"] for rcpt, _ in box.messages)
    _deliver(sim)
    assert len(set(keys)) == len(receiver.accepted)
    # no secret and no webhook path in what the admin view shows
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    shown = client.get("/v1/admin/notices", params={"status": "delivered"}).json()
    assert shown and all(d["status"] == "delivered" for d in shown)
    assert not any("token=abc" in d["target"] for d in shown)


def test_a_team_without_notices_is_told_nothing(db: Any, receiver: Receiver) -> None:
    sim = make_sim(db, _config(receiver.url, None))
    job = submit(sim, spec().name("quiet").team("language").flavors("a100-80g").replicas(1)
                 .topology(None), 60)
    run_until(sim, job, "SUCCEEDED", step=20)
    _deliver(sim)
    assert receiver.calls == 0


def test_a_rolled_back_change_leaves_no_notice(db: Any, receiver: Receiver) -> None:
    sim = make_sim(db, _config(receiver.url, None))
    job = submit(sim, spec().name("x").flavors("a100-80g").replicas(1).topology(None), 60)
    with pytest.raises(RuntimeError), sim.plane.db.write() as s:
        set_state(s, job, JobState.CANCELLED, Reason.CancelledByUser,
                  Cause("api", "tester", key="cancel"))
        raise RuntimeError("the transaction fails after the change")
    with sim.plane.db.write() as s:
        set_state(s, job, JobState.CANCELLED, Reason.CancelledByUser,
                  Cause("api", "tester", key="cancel"))
    _deliver(sim)
    assert receiver.kinds() == ["cancelled"]


def test_a_receiver_failing_twice_gets_the_notice_once(db: Any, receiver: Receiver,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    receiver.fail_first = 2
    sim = make_sim(db, _config(receiver.url, None))
    job = submit(sim, spec().name("x").flavors("a100-80g").replicas(1).topology(None), 60)
    cancel_job(sim.plane.db, job, "tester", by_admin=False)
    _deliver(sim)
    assert receiver.calls == 1
    _deliver(sim)  # not due yet (back-off 5 s, the clock has not moved)
    assert receiver.calls == 1
    _deliver(sim, rounds=4, gap=30)
    assert receiver.calls == 3 and receiver.kinds() == ["cancelled"]
    with sim.plane.db.read() as s:
        [row] = store.listing(s, None, None, 10)
    assert (row.delivery.status, row.delivery.attempts) == ("delivered", 3)


def test_a_receiver_that_always_fails_ends_in_the_dead_letter_view(
        db: Any, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.always_fail = True
    sim = make_sim(db, _config(receiver.url, None, max_attempts=3))
    job = submit(sim, spec().name("x").flavors("a100-80g").replicas(1).topology(None), 60)
    cancel_job(sim.plane.db, job, "tester", by_admin=False)
    caplog.set_level("INFO", logger="isthmus")
    _deliver(sim, rounds=6, gap=120)
    assert receiver.calls == 3  # bounded: max_attempts, then no more
    told = [r.getMessage() for r in caplog.records if "failed (try" in r.getMessage()]
    assert len(told) == 3 and "; dead" in told[-1]
    assert not any("token=abc" in m or "/hooks/" in m or SECRET in m for m in caplog.messages)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    dead = client.get("/v1/admin/notices", params={"status": "dead"}).json()
    assert [(d["kind"], d["job_id"], d["attempts"]) for d in dead] == [("cancelled", job, 3)]
    assert dead[0]["last_error"].startswith("HTTP 500")
    assert dead[0]["target"].startswith("http://127.0.0.1:") and "token" not in dead[0]["target"]

    # the receiver is fixed; an admin sends it again
    receiver.always_fail = False
    assert client.post(f"/v1/admin/notices/{dead[0]['id']}/retry").status_code == 200
    assert client.post("/v1/admin/notices/999999/retry").status_code == 404
    assert [line for line in audit.lines(sim.plane.db) if line[0] == "notice.retry"] == [
        ("notice.retry", f"notice-delivery:{dead[0]['id']}", "local", 200),
        ("notice.retry", "notice-delivery:999999", "local", 404)]
    # due at the API's clock (the wall clock); the simulated leader's runs days behind it
    sim.advance((datetime.now(UTC) - sim.clock.now).total_seconds() + 1)
    _deliver(sim)
    assert receiver.kinds() == ["cancelled"]
    assert client.get("/v1/admin/notices", params={"status": "dead"}).json() == []


def test_the_cli_shows_the_dead_letter_view(db: Any, receiver: Receiver,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli import main as cli

    receiver.always_fail = True
    sim = make_sim(db, _config(receiver.url, None, max_attempts=1))
    job = submit(sim, spec().name("x").flavors("a100-80g").replicas(1).topology(None), 60)
    cancel_job(sim.plane.db, job, "tester", by_admin=False)
    _deliver(sim)
    client = TestClient(create_app(sim.plane.config, sim.plane.db))

    class Via:
        """The CLI's client, calling the app in-process."""

        def __init__(self, *args: object) -> None:
            pass

        def __enter__(self) -> Via:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def notices(self, status: str | None, team: str | None, limit: int) -> Any:
            params = {"limit": limit, **({"status": status} if status else {})}
            return client.get("/v1/admin/notices", params=params).json()

    monkeypatch.setattr("broker.cli.common.Client", Via)
    out = CliRunner().invoke(cli.app, ["admin", "notices", "--dead"])
    assert out.exit_code == 0, out.output
    assert "dead" in out.output and job in out.output and "HTTP 500" in out.output


def test_a_jobs_own_webhook_is_told_when_its_host_is_allowed(db: Any,
                                                             receiver: Receiver) -> None:
    sim = make_sim(db, _config("http://elsewhere.invalid/x", None,
                               job_webhook_hosts=["127.0.0.1"], signing_secret_env=None))
    job = submit(sim, spec().name("own").team("language").flavors("a100-80g").replicas(1)
                 .topology(None).set("notify", {"webhooks": [receiver.url],
                                                "events": ["succeeded"]}), 60)
    run_until(sim, job, "SUCCEEDED", step=20)
    _deliver(sim)
    assert receiver.kinds() == ["succeeded"]
    assert SIGNATURE_HEADER not in receiver.accepted[0][1]


def test_the_leaders_loop_delivers_them(db: Any, receiver: Receiver) -> None:
    """No test calls the pass: the runtime's `notices` job does, on the leader."""
    from broker.control.lease import LeaderLease
    from broker.control.runtime import Intervals, Runtime
    from tests.harness.wait import wait_until

    sim = make_sim(db, _config(receiver.url, None))
    job = submit(sim, spec().name("x").flavors("a100-80g").replicas(1).topology(None), 60)
    cancel_job(sim.plane.db, job, "tester", by_admin=False)
    iv = Intervals(admission=60, dispatch=60, reconcile=60, lease_ttl=1.5, notices=0.1)
    runtime = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="r1", ttl=iv.lease_ttl), iv)
    runtime.start()
    try:
        wait_until(lambda: receiver.kinds() == ["cancelled"], 60, "the cancelled notice")
    finally:
        runtime.stop()
