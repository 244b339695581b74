"""Views through the API on the simulated federation, on both databases: pools, quotas, the
usage report (totals against the ledger, CSV, team scoping) and a job's decisions."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import IsthmusConfig, parse_config
from broker.orchestration.submission import cancel_job
from broker.store import daily_sums
from broker.store.tables import LEDGER_ENTRIES as ENTRIES
from broker.views.usage import CSV_FIELDS
from tests.builders import spec
from tests.harness.sim import CONFIG, Sim, cycle, run_until, state, submit

ADMIN, VISION, LANGUAGE = ({"Authorization": f"Bearer {t}"} for t in ("adm", "vis", "lang"))


def _token(name: str, secret: str, team: str | None, role: str) -> dict[str, Any]:
    return {"name": name, "team": team, "role": role,
            "token_sha256": hashlib.sha256(secret.encode()).hexdigest()}


@pytest.fixture
def sim_config() -> IsthmusConfig:
    data = copy.deepcopy(CONFIG)
    data["pools"][0]["cost_weight"] = 1.5
    data["auth"] = {"mode": "token", "tokens": [
        _token("ops", "adm", None, "admin"), _token("vera", "vis", "vision", "user"),
        _token("lars", "lang", "language", "user")]}
    return parse_config(data)


def _client(sim: Sim) -> TestClient:
    app = create_app(sim.plane.config, sim.plane.db)
    app.state.runtime = SimpleNamespace(plane=sim.plane, wake=lambda name: None)
    return TestClient(app)


def _workload(sim: Sim) -> dict[str, str]:
    """vision: one job succeeds on slurm-h100; language: one is cancelled while it runs on
    k8s-a100 and one waits (its quota is used up)."""
    jobs = {
        "ok": submit(sim, spec().team("vision").flavors("h100-80g").replicas(2).gpus(8), 120),
        "cancel": submit(sim, spec().team("language").flavors("a100-80g").replicas(2).gpus(8)
                         .topology(None), 3600),
    }
    run_until(sim, jobs["cancel"], "RUNNING", step=20)
    jobs["wait"] = submit(sim, spec().team("language").flavors("a100-80g").replicas(1).gpus(8)
                          .topology(None), 60)
    cycle(sim, 30)
    cancel_job(sim.plane.db, jobs["cancel"], "lars", by_admin=False)
    run_until(sim, jobs["ok"], "SUCCEEDED")
    run_until(sim, jobs["cancel"], "CANCELLED")
    return jobs


def _ledger(sim: Sim, where: str = "") -> dict[str, float]:
    with sim.plane.db.read() as s:
        rows = s.connection().execute(sa.text(
            "SELECT kind, SUM(gpu_hours), SUM(cost) FROM ledger_entries WHERE kind NOT IN "
            f"('reserve', 'release') {where} GROUP BY kind")).all()
    out = {k: float(h) for k, h, _ in rows}
    out["cost:usage"] = sum(float(c or 0) for k, _, c in rows if k == "usage")
    return out


def test_usage_report_adds_up_against_the_ledger_and_is_team_scoped(sim: Sim) -> None:
    _workload(sim)
    client = _client(sim)
    led = _ledger(sim)
    assert led["usage"] > 0 and led.get("waste:cancelled", 0) > 0
    for by in ("team", "pool", "flavor", "user"):
        body = client.get(f"/v1/reports/usage?by={by}", headers=ADMIN).json()
        total = body["total"]
        assert total["gpu_hours"] == pytest.approx(led["usage"])
        assert total["cost"] == pytest.approx(led["cost:usage"])
        assert total["waste_cancelled"] == pytest.approx(led["waste:cancelled"])
        waste = sum(v for k, v in led.items() if k.startswith("waste"))
        assert total["wasted_gpu_hours"] == pytest.approx(waste)
        assert sum(line["gpu_hours"] for line in body["lines"]) == pytest.approx(led["usage"])
    by_pool = {line["key"]: line for line in
               client.get("/v1/reports/usage?by=pool", headers=ADMIN).json()["lines"]}
    assert set(by_pool) == {"slurm-h100", "k8s-a100"}
    # cost = hours x flavor weight (h100: 2.0) x pool weight (slurm-h100: 1.5)
    assert by_pool["slurm-h100"]["cost"] == pytest.approx(by_pool["slurm-h100"]["gpu_hours"] * 3)
    mine = client.get("/v1/reports/usage?by=team", headers=LANGUAGE).json()
    assert [line["key"] for line in mine["lines"]] == ["language"] and mine["team"] == "language"
    assert mine["total"]["gpu_hours"] == pytest.approx(_ledger(sim, "AND team = 'language'")
                                                       ["usage"])
    users = client.get("/v1/reports/usage?by=user", headers=VISION).json()["lines"]
    assert [u["key"] for u in users] == ["tester"]
    assert users[0]["gpu_hours"] == pytest.approx(_ledger(sim, "AND team = 'vision'")["usage"])


def test_usage_report_window_csv_and_bad_parameters(sim: Sim) -> None:
    _workload(sim)
    client = _client(sim)
    r = client.get("/v1/reports/usage?by=team&format=csv", headers=ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0][:3] == ["team", "gpu_hours", "cost"]
    assert [row[0] for row in rows[1:]] == ["language", "vision", "total"]
    assert float(rows[-1][1]) == pytest.approx(_ledger(sim)["usage"], rel=1e-5)
    later = client.get("/v1/reports/usage?from=2027-01-01", headers=ADMIN).json()
    assert later["lines"] == [] and later["total"]["gpu_hours"] == 0
    day = client.get("/v1/reports/usage?from=2026-11-29&to=2026-11-30", headers=ADMIN).json()
    assert day["total"]["gpu_hours"] == pytest.approx(_ledger(sim)["usage"])
    for bad in ("by=rack", "from=yesterday", "from=2026-11-30&to=2026-11-29", "format=xml",
                "from=0001-01-01T00:00:00%2B01:00"):
        assert client.get(f"/v1/reports/usage?{bad}", headers=ADMIN).status_code == 422, bad
    assert client.get("/v1/reports/usage").status_code == 401


def test_pools_and_quotas(sim: Sim) -> None:
    job = submit(sim, spec().team("vision").flavors("h100-80g").replicas(2).gpus(8), 600)
    run_until(sim, job, "RUNNING")
    client = _client(sim)
    pools = {p["name"]: p for p in client.get("/v1/pools", headers=VISION).json()}
    h100 = pools["slurm-h100"]
    assert h100["reachable"] and h100["capacity_gpus"] == 32
    assert (h100["isthmus_gpus"], h100["free_gpus"], h100["foreign_gpus"]) == (16, 16, 0)
    assert h100["largest_free_rack"] == 16 and len(h100["racks"]) == 2
    quotas = client.get("/v1/quotas", headers=VISION).json()
    assert {q["team"] for q in quotas} == {"vision"}
    line = next(q for q in quotas if q["flavor"] == "h100-80g")
    assert (line["nominal"], line["used"], line["borrowed"]) == (32, 16, 0)
    everyone = client.get("/v1/quotas", headers=ADMIN).json()
    assert {q["team"] for q in everyone} == {"vision", "language"}


def test_job_decisions_are_team_scoped(sim: Sim) -> None:
    jobs = _workload(sim)
    client = _client(sim)
    waiting = jobs["wait"]
    decided = client.get(f"/v1/jobs/{jobs['ok']}/decisions", headers=VISION).json()
    assert decided and decided[0]["admitted"] and decided[0]["placement_pool"] == "slurm-h100"
    assert decided[0]["inputs_digest"]
    assert client.get(f"/v1/jobs/{jobs['ok']}/decisions", headers=LANGUAGE).status_code == 404
    assert client.get(f"/v1/jobs/{waiting}/decisions", headers=VISION).status_code == 404
    mine = client.get(f"/v1/jobs/{waiting}/decisions", headers=LANGUAGE)
    assert mine.status_code == 200 and mine.json()
    assert client.get("/v1/admin/cycles", headers=LANGUAGE).status_code == 403
    cycles = client.get("/v1/admin/cycles?limit=3", headers=ADMIN).json()
    assert len(cycles) == 3 and cycles[0]["id"] > cycles[1]["id"] > cycles[2]["id"]
    older = client.get(f"/v1/admin/cycles?limit=3&before={cycles[-1]['id']}",
                       headers=ADMIN).json()
    assert older and older[0]["id"] < cycles[-1]["id"]
    assert state(sim, waiting)[0] in ("QUEUED", "ADMITTED", "PREPARING", "RUNNING", "SUCCEEDED")


def test_entries_booked_before_0010_are_grouped_by_their_attempt_and_job(sim: Sim) -> None:
    jobs = _workload(sim)
    with sim.plane.db.write() as s:  # as revision 0006 wrote waste: no kind, cost, pool, user
        s.connection().execute(sa.text(
            "INSERT INTO ledger_entries (job_id, attempt, kind, team, flavor, gpus, "
            "borrowed_gpus, gpu_hours, at, note) SELECT job_id, number, 'waste', 'vision', "
            "flavor, gpus, 0, 2.5, ended_at, '' FROM attempts WHERE job_id = :j"),
            {"j": jobs["ok"]})
        daily_sums.add_entries(s, ENTRIES.c.kind == "waste")  # what a bulk load does
    client = _client(sim)
    pools = {line["key"]: line for line in
             client.get("/v1/reports/usage?by=pool", headers=ADMIN).json()["lines"]}
    assert pools["slurm-h100"]["waste_unsplit"] == pytest.approx(2.5)
    assert "" not in pools
    users = client.get("/v1/reports/usage?by=user&format=csv", headers=ADMIN).text
    rows = list(csv.reader(io.StringIO(users)))
    assert [r[0] for r in rows[1:]] == ["tester", "total"]
    assert float(rows[1][CSV_FIELDS.index("waste_unsplit")]) == pytest.approx(2.5)
