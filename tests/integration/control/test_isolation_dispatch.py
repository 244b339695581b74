"""Issue 11, finding 2: one intent whose dispatch fails (a render that overflows, a refusal of
the Slurm transport, any unexpected exception, an unreachable backend) never keeps the other
intents, of its backend or of another, from being dispatched; and it does not hold quota."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from backends.base import SubmitRequest, SubmitResult
from backends.slurm import SlurmBackend, SubmitRefused
from backends.slurm.containers import ContainerSettings
from backends.slurm.inventory import SlurmPoolBinding
from backends.slurm.records import BatchJob
from backends.slurm.settings import SlurmSettings
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.domain.facts import Fact
from broker.store import attempts as att
from broker.store.queries import get_job
from tests.builders import spec
from tests.harness.sim import Sim, consistent, state, submit
from tests.harness.slurm_fakes import FakeTransport
from tests.integration.control.poison import events, poison_snapshot


def _three(sim: Sim) -> tuple[str, str, str]:
    """Two Slurm jobs and one Kubernetes job, all admitted, none dispatched yet."""
    bad = submit(sim, spec().name("bad").flavors("h100-80g").replicas(1).topology(None))
    slurm = submit(sim, spec().name("slurm").team("language").flavors("h100-80g").replicas(1)
                   .topology(None))
    k8s = submit(sim, spec().name("k8s").flavors("a100-80g").replicas(1).topology(None))
    run_admission(sim.plane)
    for j in (bad, slurm, k8s):
        assert state(sim, j)[0] == "ADMITTED"
    return bad, slurm, k8s


def _excluded_pools(sim: Sim, job_id: str) -> list[str]:
    with sim.plane.db.read() as s:
        row = get_job(s, job_id)
        assert row is not None
        return list(json.loads(row.exclude_json or "{}").get("pools", []))


def test_an_unexpected_dispatch_error_requeues_that_job_alone(sim: Sim) -> None:
    bad, slurm, k8s = _three(sim)
    backend = sim.backends["sim-slurm"]
    original = backend.submit

    def submit_or_fail(request: SubmitRequest) -> SubmitResult:
        if getattr(request, "job_id", None) == bad:
            raise KeyError("a bug met only by this job")
        return original(request)

    backend.submit = submit_or_fail  # type: ignore[method-assign]
    run_dispatch(sim.plane)  # raised KeyError, leaving every later intent ADMITTED
    assert state(sim, slurm) == ("PREPARING", "BackendPending")
    assert state(sim, k8s) == ("PREPARING", "BackendPending")
    assert state(sim, bad) == ("QUEUED", "InternalError")
    message = events(sim, bad)[-1][2]
    assert "internal error during dispatch (KeyError); correlation id" in message
    assert "pool slurm-h100 is avoided" in message
    assert _excluded_pools(sim, bad) == ["slurm-h100"]
    consistent(sim)  # its reservation is released


def test_a_refusal_of_the_slurm_transport_is_a_refusal(sim: Sim) -> None:
    bad, slurm, k8s = _three(sim)
    backend = sim.backends["sim-slurm"]
    original = backend.submit

    def submit_or_refuse(request: SubmitRequest) -> SubmitResult:
        if getattr(request, "job_id", None) == bad:
            raise SubmitRefused("sbatch: error: Batch job submission failed: Invalid qos")
        return original(request)

    backend.submit = submit_or_refuse  # type: ignore[method-assign]
    run_dispatch(sim.plane)  # SubmitRefused escaped dispatch_one
    assert state(sim, bad) == ("QUEUED", "DispatchRefused")
    assert "Invalid qos" in events(sim, bad)[-1][2]
    assert state(sim, slurm)[0] == state(sim, k8s)[0] == "PREPARING"
    consistent(sim)


def test_an_unreachable_backend_is_asked_once_per_pass_and_holds_up_nobody_else(
    sim: Sim,
) -> None:
    jobs = [submit(sim, spec().name(f"s{i}").flavors("h100-80g").replicas(1).topology(None))
            for i in range(3)]
    k8s = submit(sim, spec().name("k8s").flavors("a100-80g").replicas(1).topology(None))
    run_admission(sim.plane)
    backend = sim.backends["sim-slurm"]
    backend.reachable = False
    calls = []
    original = backend.lookup

    def lookup(name: str) -> Fact | None:
        calls.append(name)
        return original(name)

    backend.lookup = lookup  # type: ignore[method-assign]
    assert run_dispatch(sim.plane) == 1
    assert len(calls) == 1, calls
    assert state(sim, k8s)[0] == "PREPARING"
    for j in jobs:
        assert state(sim, j) == ("ADMITTED", "BackendUnavailable")
        assert "unreachable" in events(sim, j)[-1][2]
    backend.reachable = True
    assert run_dispatch(sim.plane) == 3


@dataclass
class SubmittingTransport(FakeTransport):
    submitted: list[str] | None = None

    def submit(self, job: BatchJob, *, as_user: str | None = None) -> str:
        self.submitted = [*(self.submitted or []), job.name]
        return str(1000 + len(self.submitted))

    def find(self, name: str) -> list:
        return []

    def accounting(self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (),
                   since: datetime) -> list:
        return []


@pytest.mark.parametrize(
    "field", [pytest.param("max_runtime", id="max_runtime"),
              pytest.param("gang__memory_per_replica", id="memory_per_replica")],
)
def test_a_slurm_render_that_overflows_is_contained(sim: Sim, field: str) -> None:
    bad, slurm, k8s = _three(sim)  # placed on the simulated inventory, then dispatched to:
    transport = SubmittingTransport()
    sim.plane.backends = {
        **sim.plane.backends,
        "sim-slurm": SlurmBackend(
            "sim-slurm", [SlurmPoolBinding("slurm-h100", "h100", "h100-80g")],
            # pyxis, as the simulated Slurm it stands in for: the jobs name images
            SlurmSettings(user="isthmus", container=ContainerSettings(runtime="pyxis")),
            transport,
            clock=lambda: datetime(2026, 11, 29, tzinfo=UTC),
        ),
    }
    poison_snapshot(sim, bad, **{field: 10**400})
    run_dispatch(sim.plane)  # OverflowError from the renderer stopped the pass
    with sim.plane.db.read() as s:
        assert [a.dispatch for a in att.attempts_of(s, bad)] == ["abandoned"]
    job_state, reason = state(sim, bad)
    assert job_state == "QUEUED"
    # a refusal naming the field; InternalError if the stored snapshot no longer validates
    assert reason in ("DispatchRefused", "InternalError"), reason
    if reason == "DispatchRefused":
        assert "too large for Slurm" in events(sim, bad)[-1][2]
    assert transport.submitted is not None and len(transport.submitted) == 1
    assert state(sim, slurm)[0] == state(sim, k8s)[0] == "PREPARING"
    consistent(sim)
