"""/metrics on a simulated federation that did some work: its names pass `promtool check
metrics`, the gauges read from the store say what the federation holds, the reconciler sets
the lag, failures are counted by category and pool, and the endpoint can require a token."""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker import metrics
from broker.api.app import create_app
from broker.config import parse_config
from broker.control.lease import LeaderLease
from broker.control.reconcile import run_reconcile
from tests.builders import spec
from tests.fixtures import promtool
from tests.harness.metrics import metrics_workload, scrape_metrics
from tests.harness.sim import CONFIG, Sim, attempts_of, cycle, run_until, state, submit


def exported_names(text: str) -> set[str]:
    """Every family and sample name in an exposition."""
    names = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    return names | set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))


def test_metrics_pass_promtool_check_metrics(sim: Sim) -> None:
    metrics_workload(sim)
    text = scrape_metrics(sim)
    proc = promtool.run(["check", "metrics"], stdin=text)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout + proc.stderr)
    names = exported_names(text)
    wanted = {"isthmus_reconcile_lag_seconds", "isthmus_gpus_idle", "isthmus_gpus_allocated",
              "isthmus_attempt_failures_total", "isthmus_queue_oldest_age_seconds",
              "isthmus_gpus_borrowed", "isthmus_gpu_wasted_seconds_total",
              "isthmus_gpu_seconds_total", "isthmus_gpu_cost_total",
              "isthmus_leader_lease_valid", "isthmus_ledger_drift"}
    assert wanted <= names, wanted - names
    assert names >= metrics.STORE_FAMILIES
    assert 'isthmus_reconcile_lag_seconds{backend="sim-k8s"}' in text
    assert re.search(r'isthmus_attempt_failures_total\{category="USER_ERROR",oom="true",'
                     r'pool="k8s-a100"\} [1-9]', text), text


def test_promtool_check_metrics_rejects_a_non_base_unit() -> None:
    """The check above has teeth: GPU-hours (the old counter's unit) fail it."""
    bad = "# HELP isthmus_gpu_hours_total x\n# TYPE isthmus_gpu_hours_total counter\n" \
          "isthmus_gpu_hours_total 1\n"
    proc = promtool.run(["check", "metrics"], stdin=bad)
    assert proc.returncode != 0 and "base unit" in proc.stdout + proc.stderr


def test_store_gauges_say_what_the_federation_holds(sim: Sim) -> None:
    began = datetime.now(UTC)
    jobs = metrics_workload(sim)
    waiting = submit(sim, spec().name("waits").flavors("h100-80g").replicas(4).gpus(8)
                     .topology(None), 60)  # the whole pool, of which language holds 8
    cycle(sim, 1)
    sim.advance(1200)  # 20 minutes: no progress from the running job since it started

    def read(clock: Callable[[], datetime] = lambda: sim.clock.now,
             ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        collector = metrics.FederationState(sim.plane.db, ttl=0, drift_ttl=0, clock=clock)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in collector.collect() for s in fam.samples}

    got = read()
    running = (("pool", "slurm-h100"), ("team", "language"))
    assert got[("isthmus_gpus_idle", running)] == 8
    assert got[("isthmus_gpus_allocated", (*running[:1], ("state", "RUNNING"),
                                           *running[1:]))] == 8
    # language has no nominal h100 quota: all of its 8 GPUs are borrowed from the cohort
    assert got[("isthmus_gpus_borrowed", (("flavor", "h100-80g"), ("team", "language")))] == 8
    # submissions are stamped by the wall clock, not the simulated one
    at = datetime.now(UTC) + timedelta(minutes=20)
    later = read(lambda: at)
    age = later[("isthmus_queue_oldest_age_seconds", (("flavor", "h100-80g"), ("team", "vision")))]
    assert 1200 <= age <= (at - began).total_seconds()  # the oldest, submitted since `began`
    assert got[("isthmus_queued_gpus", (("flavor", "h100-80g"), ("team", "vision")))] == 32
    assert got[("isthmus_ledger_drift", (("check", "quota"),))] == 0
    assert got[("isthmus_ledger_drift", (("check", "uncharged"),))] == 0
    assert got[("isthmus_leader_lease_valid", ())] == 0  # nobody leads this plane

    lease = LeaderLease(sim.plane.db, ttl=3600)
    assert lease.try_acquire()
    assert read()[("isthmus_leader_lease_valid", ())] == 1
    # a progress report makes the job busy again
    from broker.store import attempts as att

    a = attempts_of(sim, jobs["running"])[-1]
    with sim.plane.db.write() as s:
        att.update(s, a.job_id, a.number, last_progress_at=sim.clock.now)
    assert read()[("isthmus_gpus_idle", running)] == 0
    assert state(sim, waiting)[0] == "QUEUED"


def test_reconcile_lag_grows_while_a_backend_cannot_be_observed(sim: Sim) -> None:
    job = submit(sim, spec().flavors("h100-80g").replicas(1).gpus(8).topology(None), 3600)
    run_until(sim, job, "RUNNING", step=20)

    def lag() -> float:
        return metrics.RECONCILE_LAG.labels("sim-slurm")._value.get()

    run_reconcile(sim.plane, "sim-slurm")
    assert lag() == 0
    sim.backends["sim-slurm"].reachable = False
    sim.advance(90)
    run_reconcile(sim.plane, "sim-slurm")
    sim.advance(60)
    run_reconcile(sim.plane, "sim-slurm")
    assert lag() == timedelta(seconds=150).total_seconds()
    sim.backends["sim-slurm"].reachable = True
    run_reconcile(sim.plane, "sim-slurm")
    assert lag() == 0


def test_metrics_can_require_a_token(sim: Sim) -> None:
    token = "scraper-secret"
    digest = hashlib.sha256(token.encode()).hexdigest()
    data = copy.deepcopy(CONFIG)
    data["auth"] = {"mode": "token", "tokens": [
        {"name": "prometheus", "team": "vision", "token_sha256": digest}]}
    for server, bare in (({"metrics_auth": True}, 401), ({}, 200)):
        data["server"] = server
        with TestClient(create_app(parse_config(data), sim.plane.db)) as client:
            assert client.get("/metrics").status_code == bare
            r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and "isthmus_jobs" in r.text
            wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == (401 if server else 200)


def test_quota_drift_gauge_reads_counters_and_entries_of_one_moment(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation committed between the gauge's read of the counters and its read of the
    entries is no drift: on PostgreSQL in READ COMMITTED the two reads saw two moments."""
    from broker import ledger

    job = submit(sim, spec().flavors("h100-80g").replicas(1).gpus(8).topology(None), 60)
    real = ledger.live_reservations
    committed: list[str] = []

    def entries_after_a_commit(session: Any) -> Any:
        if not committed:  # another writer commits between the two reads
            with sim.plane.db.write() as s:
                ledger.reserve(s, ledger.Reservation(job, 1, "vision", "h100-80g", 8),
                               sim.clock.now)
            committed.append(job)
        return real(session)

    monkeypatch.setattr(ledger, "live_reservations", entries_after_a_commit)
    collector = metrics.FederationState(sim.plane.db, ttl=0, drift_ttl=0)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in collector.collect() for s in fam.samples}
    assert committed == [job]
    assert got[("isthmus_ledger_drift", (("check", "quota"),))] == 0
