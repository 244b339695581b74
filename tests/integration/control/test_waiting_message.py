"""A waiting job shows what its backend says now: a new message is applied even when the phase
and the reason stay the same (Kueue's 'not evaluated yet', then its verdict; Slurm's Priority,
then Resources). The reconciler's quick check compared phase and reason only, and a job kept
the first message for as long as it waited (stop 39's CI run caught it in the Kueue test)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.config import IsthmusConfig
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlParams, ControlPlane
from broker.control.reconcile import run_reconcile
from broker.domain import Reason
from broker.domain.facts import Fact, Finding, Phase
from broker.store import Database
from broker.store.queries import get_job, job_events
from tests.builders import spec
from tests.harness.sim import Sim, submit


class Saying:
    """Wraps a backend: `observe` says of each object it knows that Kueue holds it, in the
    words of `message`."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.kind = inner, inner.name, inner.kind
        self.message = ""

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        return [Finding(Phase.PENDING, Reason.HeldByKueue, raw_state="HeldByKueue",
                        message=self.message).fact(
                    backend=f.backend, backend_name=f.backend_name, backend_id=f.backend_id,
                    job_id=f.job_id, attempt=f.attempt, observed_at=f.observed_at)
                for f in self.inner.observe(names) if f.phase is not Phase.LOST]


def _plane(sim: Sim, db: Database, config: IsthmusConfig, saying: Saying) -> ControlPlane:
    """A plane of its own (a fresh one: what a restarted leader starts with)."""
    return ControlPlane(db, config, {**sim.backends, "sim-slurm": saying},
                        clock=lambda: sim.clock.now, params=ControlParams(lost_grace_s=60))


def _shown(plane: ControlPlane, job_id: str) -> tuple[str, str, str, int]:
    with plane.db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        return job.state, job.reason, job.message, len(job_events(s, job_id))


def test_a_new_message_is_shown_while_the_reason_stays(
        sim: Sim, db: Database, sim_config: IsthmusConfig) -> None:
    saying = Saying(sim.backends["sim-slurm"])
    plane = _plane(sim, db, sim_config, saying)
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8))
    run_admission(plane)
    run_dispatch(plane)

    saying.message = "Kueue has not evaluated the Workload yet"
    run_reconcile(plane, "sim-slurm")
    state, reason, message, events = _shown(plane, job)
    assert (state, reason, message) == ("PREPARING", "HeldByKueue", saying.message)

    run_reconcile(plane, "sim-slurm")  # nothing new: nothing written
    assert _shown(plane, job)[3] == events

    saying.message = "insufficient unused quota for nvidia.com/gpu in flavor h100-80g"
    run_reconcile(plane, "sim-slurm")
    state, reason, message, after = _shown(plane, job)
    assert (state, reason, message) == ("PREPARING", "HeldByKueue", saying.message)
    assert after == events + 1  # one event says it

    # a restarted leader knows nothing it told: it shows what the backend says now
    saying.message = "insufficient unused quota, 16 more needed"
    restarted = _plane(sim, db, sim_config, saying)
    run_reconcile(restarted, "sim-slurm")
    assert _shown(restarted, job)[:3] == ("PREPARING", "HeldByKueue", saying.message)
