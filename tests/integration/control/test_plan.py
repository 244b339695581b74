"""POST /v1/plan: the what-if answer agrees with what admission then does, and stores nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.domain import JobSpec
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store.records import EVENTS, JOBS
from tests.builders import spec
from tests.harness.sim import Sim


def _client(sim: Sim, control: bool = True) -> TestClient:
    runtime = SimpleNamespace(plane=sim.plane, leading=True, wake=lambda *_: None)
    return TestClient(create_app(sim.plane.config, sim.plane.db,
                                 runtime if control else None))  # type: ignore[arg-type]


def _counts(sim: Sim) -> tuple[int, int]:
    with sim.plane.db.read() as s:
        return (s.execute(select(func.count()).select_from(JOBS)).scalar_one(),
                s.execute(select(func.count()).select_from(EVENTS)).scalar_one())


def _fill_a100(sim: Sim) -> None:
    """Gangs of vision (48 GPUs) and language (16) take all 64 a100 GPUs for their declared
    2 hours, each team within its nominal quota."""
    cfg, db = sim.plane.config, sim.plane.db
    submit_job(db, cfg, spec().flavors("a100-80g").replicas(6).topology(None).build(), "t")
    submit_job(db, cfg, spec().team("language").flavors("a100-80g").replicas(2)
               .topology(None).build(), "t")
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(30)  # the simulated backends run them and announce their declared ends


CASES = [
    pytest.param(spec().flavors("h100-80g").replicas(2), True, "slurm-h100", id="fits-now"),
    pytest.param(spec().flavors("a100-80g").replicas(1).topology(None), False, None,
                 id="waits-for-capacity"),
]


@pytest.mark.parametrize(("builder", "admitted", "pool"), CASES)
def test_plan_agrees_with_admission(sim: Sim, builder: Any, admitted: bool,
                                    pool: str | None) -> None:
    _fill_a100(sim)
    client = _client(sim)
    job_spec: JobSpec = builder.build()
    body = job_spec.model_dump(mode="json", exclude_none=True)
    before = _counts(sim)
    answer = client.post("/v1/plan", json=body)
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert _counts(sim) == before  # no job, no event
    assert plan["basis"] == "admission" and plan["would_reject"] is False
    assert plan["admitted"] is admitted
    x = plan["explanation"]
    assert x["pools"], x  # every pool's verdict
    if admitted:
        assert x["placement"]["pool"] == pool
        assert plan["estimate_method"] == "now"
    else:
        assert plan["estimated_start"] is not None, plan
        assert plan["estimate_method"] == "releases"
    # now for real: the same spec, submitted, and one admission cycle
    job = submit_job(sim.plane.db, sim.plane.config, job_spec, "t").job
    run_admission(sim.plane)
    with sim.plane.db.read() as s:
        stored = att.get_explanation(s, job.id)
    assert stored is not None
    import json

    real = json.loads(stored[1])
    assert real["admitted"] is plan["admitted"]
    assert real["reason"] == plan["reason"]
    assert (real["placement"] or {}).get("pool") == (x["placement"] or {}).get("pool")
    assert [p["pool"] for p in real["pools"]] == [p["pool"] for p in x["pools"]]
    if not admitted:
        assert real["estimated_start"] == plan["estimated_start"].replace("Z", "+00:00") or \
            real["estimated_start"][:19] == plan["estimated_start"][:19]
        got = client.get(f"/v1/jobs/{job.id}").json()
        assert got["wait"]["position"] == 1 and got["wait"]["team_position"] == 1
        assert got["wait"]["estimate_method"] == "releases"


def test_plan_of_infeasible_spec_says_it_would_be_rejected(sim: Sim) -> None:
    before = _counts(sim)
    body = spec().flavors("h100-80g").replicas(64).build().model_dump(mode="json",
                                                                        exclude_none=True)
    plan = _client(sim).post("/v1/plan", json=body).json()
    assert plan["would_reject"] is True and plan["reason"] == "ExceedsCapacity", plan
    assert _counts(sim) == before


def test_plan_without_control_plane_answers_from_feasibility(sim: Sim) -> None:
    body = spec().build().model_dump(mode="json", exclude_none=True)
    plan = _client(sim, control=False).post("/v1/plan", json=body).json()
    assert plan["basis"] == "feasibility" and plan["would_reject"] is False
    assert "--no-control" in plan["note"] and plan["explanation"] is None


def test_plan_validates_like_submit(sim: Sim) -> None:
    body = spec().build().model_dump(mode="json", exclude_none=True)
    body["gang"]["replicas"] = 0
    answer = _client(sim).post("/v1/plan", json=body)
    assert answer.status_code == 422 and "gang.replicas" in answer.json()["detail"]
