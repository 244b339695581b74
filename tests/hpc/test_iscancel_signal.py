"""iscancel --signal against the API on the simulated federation (in-process): a job on
Kubernetes cannot be signalled and the answer says why; a job that is not running neither; a bad
signal name is refused before anything is asked. (On real Slurm: test_dropins_slurm.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

import broker.dropins.common as common
from broker.api.app import create_app
from broker.config import parse_config
from broker.domain.scheduling import ArrayMember, Scheduling
from broker.dropins import iscancel
from broker.orchestration.submission import submit_job
from broker.store.db import Database
from tests.builders import spec
from tests.harness.inprocess import route_clients
from tests.harness.sim import CONFIG, make_sim, run_until, submit


@pytest.mark.parametrize(("text", "name"), [("USR1", "USR1"), ("sigusr2", "USR2"),
                                            ("15", "TERM"), ("NOPE", None), ("0", None)])
def test_signal_names_as_scancel_takes_them(text: str, name: str | None) -> None:
    assert iscancel.signal_name(text) == name


def test_kubernetes_jobs_and_waiting_jobs_are_not_signalled(
    db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = make_sim(db, parse_config(CONFIG))
    on_k8s = submit(sim, spec().flavors("a100-80g").replicas(1).topology(None), 3600)
    run_until(sim, on_k8s, "RUNNING")
    app = create_app(sim.plane.config, db)
    app.state.runtime = SimpleNamespace(plane=sim.plane, wake=lambda name: None)

    route_clients(monkeypatch, common, app)
    env = {"ISTHMUS_URL": "http://testserver", "HOME": "/nonexistent"}
    assert iscancel.run(["--signal=USR1", on_k8s], env) == 1
    err = capsys.readouterr().err
    assert f"Signal USR1 to job {on_k8s} not sent" in err and "Kubernetes" in err
    answer = TestClient(app).post(f"/v1/hpc/jobs/{on_k8s}/signal", json={"signal": "USR1"})
    assert answer.status_code == 409 and answer.json()["type"].endswith(":signal-unsupported")
    assert TestClient(app).get(f"/v1/jobs/{on_k8s}").json()["state"] == "RUNNING"

    waiting = submit(sim, spec().flavors("a100-80g").replicas(1).topology(None), 60)
    assert iscancel.run(["-s", "TERM", waiting], env) == 1
    assert "only a running job can be signalled" in capsys.readouterr().err
    bad = TestClient(app).post(f"/v1/hpc/jobs/{on_k8s}/signal", json={"signal": "USR1; id"})
    assert bad.status_code == 422


def test_an_array_is_cancelled_by_its_array_id_alone(
    db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``iscancel ARRAYID`` cancels every task, as ``scancel ARRAYID`` does: the array id has
    the shape of an Isthmus id, so the broker's "no such job" must lead to the array lookup."""

    sim = make_sim(db, parse_config(CONFIG))
    array_id = "06harrayid000001"
    tasks = []
    for index in range(3):
        built = spec().flavors("a100-80g").replicas(1).topology(None).build()
        member = ArrayMember(id=array_id, index=index, count=3)
        tasks.append(submit_job(db, sim.plane.config, built.model_copy(
            update={"scheduling": Scheduling(array=member)}), "tester").job.id)
    app = create_app(sim.plane.config, db)

    route_clients(monkeypatch, common, app)
    env = {"ISTHMUS_URL": "http://testserver", "HOME": "/nonexistent"}
    assert iscancel.run([array_id], env) == 0, capsys.readouterr().err
    states = {TestClient(app).get(f"/v1/jobs/{t}").json()["state"] for t in tasks}
    assert states == {"CANCELLED"}
    assert iscancel.run(["0123456789abcdef"], env) == 1
    assert "Invalid job id specified" in capsys.readouterr().err


def test_batch_and_full_reach_the_backend_as_scancel_b_and_f(
    db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``iscancel --signal=USR2 -b`` / ``-f`` ask the backend for the batch shell / the batch
    shell and every step, as ``scancel -b`` / ``-f`` do; without either, the steps."""
    sim = make_sim(db, parse_config(CONFIG))
    on_slurm = submit(sim, spec().flavors("h100-80g").replicas(1).topology(None), 3600)
    run_until(sim, on_slurm, "RUNNING")
    asked: list[tuple[str, str, str]] = []

    def send_signal(name: str, sig: str, whom: str = "steps") -> str:
        asked.append((name, sig, whom))
        return f"SIG{sig} sent ({whom})"

    plane = SimpleNamespace(backends=sim.plane.backends,
                            gate=lambda name: SimpleNamespace(send_signal=send_signal))
    app = create_app(sim.plane.config, db)
    app.state.runtime = SimpleNamespace(plane=plane, wake=lambda name: None)
    route_clients(monkeypatch, common, app)
    env = {"ISTHMUS_URL": "http://testserver", "HOME": "/nonexistent"}
    for flags, whom in (([], "steps"), (["-b"], "batch"), (["--full"], "full")):
        assert iscancel.run([*flags, "--signal=USR2", on_slurm], env) == 0, capsys.readouterr()
        assert asked[-1][1:] == ("USR2", whom)
    assert TestClient(app).get(f"/v1/jobs/{on_slurm}").json()["state"] == "RUNNING"
    bad = TestClient(app).post(f"/v1/hpc/jobs/{on_slurm}/signal",
                               json={"signal": "USR1", "whom": "everyone"})
    assert bad.status_code == 422
