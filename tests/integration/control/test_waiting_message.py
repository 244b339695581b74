"""A waiting job shows what its backend says now: a new message is applied even when the phase
and the reason stay the same (Kueue's 'not evaluated yet', then its verdict; Slurm's Priority,
then Resources). The reconciler's quick check compared phase and reason only, and a job kept
the first message for as long as it waited (stop 39's CI run caught it in the Kueue test)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from broker.config import IsthmusConfig
from broker.control import reconcile, reconcile_apply
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
        sim: Sim, db: Database, sim_config: IsthmusConfig,
        monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[int] = []  # the facts each pass applies

    def counted(plane: ControlPlane, changed: list[Any], now: Any) -> int:
        applied.append(len(changed))
        return real(plane, changed, now)

    real = reconcile_apply.apply_all
    monkeypatch.setattr(reconcile, "apply_all", counted)
    saying = Saying(sim.backends["sim-slurm"])
    plane = _plane(sim, db, sim_config, saying)
    job = submit(sim, spec().flavors("h100-80g").replicas(2).gpus(8))
    run_admission(plane)
    run_dispatch(plane)

    def passes(p: ControlPlane, message: str) -> int:
        saying.message = message
        run_reconcile(p, "sim-slurm")
        return applied[-1]

    assert passes(plane, "Kueue has not evaluated the Workload yet") == 1
    state, reason, message, events = _shown(plane, job)
    assert (state, reason, message) == ("PREPARING", "HeldByKueue", saying.message)
    assert passes(plane, saying.message) == 0  # nothing new: nothing read or written
    assert _shown(plane, job)[3] == events

    sim.clock.advance(61)  # new wording is written at most once a minute per job
    verdict = "insufficient unused quota for nvidia.com/gpu in flavor h100-80g, 8 more needed"
    assert passes(plane, verdict) == 1
    state, reason, message, after = _shown(plane, job)
    assert (state, reason, message) == ("PREPARING", "HeldByKueue", verdict)
    assert after == events + 1  # one event says it

    # new figures alone wait five minutes (a queue's "N more needed" moves with the load)
    moved = verdict.replace("8 more", "16 more")
    assert passes(plane, moved) == 0
    assert _shown(plane, job)[2] == verdict
    sim.clock.advance(301)
    assert passes(plane, moved) == 1
    assert _shown(plane, job)[2] == moved

    # a restarted leader knows nothing it told: it applies what the backend says once
    restarted = _plane(sim, db, sim_config, saying)
    assert passes(restarted, moved) == 1
    assert passes(restarted, moved) == 0
    assert _shown(restarted, job)[:3] == ("PREPARING", "HeldByKueue", moved)
