"""A simulated federation that did some work, and its /metrics page."""

from __future__ import annotations

import copy

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import parse_config
from broker.domain import FailureCategory, Reason
from broker.domain.facts import Phase
from broker.orchestration.submission import cancel_job
from tests.builders import spec
from tests.harness.sim import CONFIG, Sim, attempts_of, cycle, run_until, submit


def metrics_workload(sim: Sim) -> dict[str, str]:
    """A success, an OOM kill, a cancel and a job left running."""
    k8s = sim.backends["sim-k8s"]
    one = spec().flavors("a100-80g").replicas(1).gpus(8).topology(None)
    jobs = {"ok": submit(sim, one.name("ok"), 60), "oom": submit(sim, one.name("oom"), 3600),
            "cancel": submit(sim, one.name("cancel"), 3600),
            "running": submit(sim, spec().name("long").team("language").flavors("h100-80g")
                              .replicas(1).gpus(8).topology(None), 36000)}
    for name in ("oom", "cancel", "running"):
        run_until(sim, jobs[name], "RUNNING", step=20)
    a = attempts_of(sim, jobs["oom"])[-1]
    k8s._end(k8s.jobs[a.backend_name], Phase.FAILED, Reason.UserError,
             "OOMKilled: exit code 137", FailureCategory.USER_ERROR)
    cancel_job(sim.plane.db, jobs["cancel"], "tester", by_admin=False)
    cycle(sim, 120)
    return jobs


def scrape_metrics(sim: Sim, headers: dict[str, str] | None = None, **server: object) -> str:
    data = copy.deepcopy(CONFIG)
    data["server"] = server
    config = parse_config(data)
    with TestClient(create_app(config, sim.plane.db)) as client:
        r = client.get("/metrics", headers=headers or {})
        assert r.status_code == 200, r.text
        return r.text
