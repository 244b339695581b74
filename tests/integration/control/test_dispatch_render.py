"""A dispatch renders once: the backend's submit returns what it rendered (secrets masked), and
that is the attempt's record; `render` is asked only for an object found already there."""

from __future__ import annotations

import dataclasses

from backends.base import SubmitRequest, SubmitResult
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.domain.attempts import RunSnapshot
from broker.store import attempts as att
from tests.builders import spec
from tests.harness.sim import Sim, state, submit


def test_the_record_is_what_submit_rendered_and_render_is_not_asked(sim: Sim) -> None:
    job = submit(sim, spec().name("once").flavors("h100-80g").replicas(1).topology(None))
    run_admission(sim.plane)
    backend = sim.backends["sim-slurm"]
    original = backend.submit
    renders: list[SubmitRequest] = []

    def submit_rendering(request: SubmitRequest) -> SubmitResult:
        result = original(request)
        return dataclasses.replace(result, rendered="#!/bin/bash\n# as sent\n")

    def render(request: SubmitRequest) -> str:
        renders.append(request)
        return "#!/bin/bash\n# rendered again\n"

    backend.submit = submit_rendering  # type: ignore[method-assign]
    backend.render = render  # type: ignore[method-assign]
    assert run_dispatch(sim.plane) == 1
    assert state(sim, job) == ("PREPARING", "BackendPending")
    with sim.plane.db.read() as s:
        record = att.attempts_of(s, job)[0]
    assert record.rendered == "#!/bin/bash\n# as sent\n"
    assert renders == []


def test_an_adopted_object_is_rendered_for_the_record_with_the_token_masked(sim: Sim) -> None:
    job = submit(sim, spec().name("adopted").flavors("h100-80g").replicas(1).topology(None))
    run_admission(sim.plane)
    backend = sim.backends["sim-slurm"]
    with sim.plane.db.read() as s:
        intent = att.attempts_of(s, job)[0]
    snapshot = RunSnapshot.model_validate_json(intent.snapshot_json)
    assert snapshot.placement is not None
    backend.submit(SubmitRequest(  # made before a crash: the dispatch finds it and adopts it
        job_id=job, attempt=intent.number, name=intent.backend_name, snapshot=snapshot,
        placement=snapshot.placement))
    renders: list[SubmitRequest] = []

    def render(request: SubmitRequest) -> str:
        renders.append(request)
        return f"token={request.env['ISTHMUS_PROGRESS_TOKEN']}\n"

    backend.render = render  # type: ignore[method-assign]
    assert run_dispatch(sim.plane) == 1
    with sim.plane.db.read() as s:
        record = att.attempts_of(s, job)[0]
    assert len(renders) == 1 and record.rendered == "token=********\n"

