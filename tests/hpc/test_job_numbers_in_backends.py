"""The job's number reaches the backends: the dispatcher puts it in the request, the Slurm
renderer's %j/%A and the Kubernetes ranks' SLURM_JOB_ID use it (issue 28: tools parse digits)."""

from __future__ import annotations

import dataclasses
from typing import Any

from backends.base import SubmitRequest
from backends.k8s import batch_script
from backends.slurm.batch_files import user_path
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.orchestration.submission import submit_job
from broker.store import Database
from tests.builders import spec
from tests.harness.requests import slurm_request
from tests.harness.sim import CONFIG, make_sim


def _batch(request: SubmitRequest, number: int | None) -> SubmitRequest:
    return dataclasses.replace(request, job_number=number)


def test_output_patterns_use_the_number_and_the_arrays_number() -> None:
    entry: dict[str, object] = {"script": "#!/bin/bash\nsrun true", "launcher": "batch"}
    plain = _batch(slurm_request(entry), 1234)
    assert user_path("/w/%j-%A-%a.out", plain) == "/w/1234-1234-4294967294.out"
    array = {"array": {"id": "1230", "index": 4, "count": 6}}
    task = _batch(slurm_request(entry, scheduling=array), 1234)
    assert user_path("/w/%A_%a.%j", task) == "/w/1230_4.1234"
    # a job stored before numbers keeps its Isthmus id
    assert user_path("/w/%j", _batch(slurm_request(entry), None)) == "/w/01abcdefghjkmnpq"


def test_kubernetes_ranks_get_the_number_as_slurm_job_id() -> None:
    request = _batch(slurm_request({"script": "#!/bin/bash\ntrue", "launcher": "batch"}), 77)
    values = {e["name"]: e["value"] for e in batch_script.env(request)}
    assert values["SLURM_JOB_ID"] == "77"


def test_the_dispatcher_sends_the_jobs_number(db: Database) -> None:
    sim = make_sim(db, parse_config(CONFIG))
    seen: list[SubmitRequest] = []
    backend = sim.backends["sim-slurm"]
    real = backend.submit

    def spy(request: SubmitRequest) -> Any:
        seen.append(request)
        return real(request)

    backend.submit = spy  # type: ignore[method-assign]
    job = submit_job(db, sim.plane.config, spec().flavors("h100-80g").build(), "t").job
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    assert [(r.job_id, r.job_number, r.slurm_job_id) for r in seen] == [
        (job.id, job.number, str(job.number))]
