"""The runtime: APScheduler jobs under a lease, over simulated backends, on both databases."""

from __future__ import annotations

from datetime import datetime

import pytest
import sqlalchemy as sa

from broker.control.lease import LeaderLease
from broker.control.runtime import Intervals, Runtime
from broker.orchestration.submission import submit_job
from broker.store.queries import get_job
from tests.builders import spec
from tests.harness.sim import Sim
from tests.harness.wait import wait_until

FAST = Intervals(admission=0.2, dispatch=0.1, reconcile=0.2, lease_ttl=1.5)


def test_runtime_runs_jobs_to_the_end(threaded_sim: Sim) -> None:
    sim = threaded_sim
    runtime = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="r1", ttl=FAST.lease_ttl), FAST)
    runtime.start()
    try:
        s = spec().flavors("h100-80g").build()
        s = s.model_copy(update={"env": {"ISTHMUS_SIM_DURATION": "30"}})
        job = submit_job(sim.plane.db, sim.plane.config, s, "t").job.id

        def done() -> bool:
            with sim.plane.db.read() as sess:
                j = get_job(sess, job)
                return j is not None and j.state == "SUCCEEDED"

        wait_until(done, 60, "the job to succeed", interval=0.05, between=lambda: sim.advance(5))
        assert runtime.leading and sim.plane.epoch == 1
    finally:
        runtime.stop()


def test_two_replicas_one_leader_and_handover(
    threaded_sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = threaded_sim
    a = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="a", ttl=FAST.lease_ttl), FAST)
    b = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="b", ttl=FAST.lease_ttl), FAST)
    a.start()
    try:
        wait_until(lambda: a.leading, 30, "a to lead")
        answers: list[bool] = []  # b's lease keeper asking for the lease while a holds it
        asked = b.lease.try_acquire

        def ask(now: datetime | None = None) -> bool:
            answers.append(asked(now))
            return answers[-1]

        monkeypatch.setattr(b.lease, "try_acquire", ask)
        b.start()
        try:
            wait_until(lambda: len(answers) >= 3, 30, "b to ask for the lease three times")
            assert a.leading and not b.leading and not any(answers)
            a.stop()  # releases the lease: b takes over within one renewal period
            wait_until(lambda: b.leading, 30, "b to take over")
            assert b.lease.epoch == 2
        finally:
            b.stop()
    finally:
        if a.scheduler.running:
            a.stop()


def test_the_leader_prunes_the_decision_log(threaded_sim: Sim) -> None:
    """Cycles older than control.decision_retention go while the loop runs; the waiting
    job's explanation stays."""
    from broker.config import Control
    from broker.store import attempts as att
    from broker.store.pools import set_drained
    from broker.store.tables import utcnow

    sim = threaded_sim
    control = Control(decision_retention=60.0, decision_prune_batch=3)
    sim.plane.config = sim.plane.config.model_copy(update={"control": control})
    with sim.plane.db.write() as s:
        set_drained(s, "slurm-h100", True, "maintenance", "ops", utcnow())
    job = submit_job(sim.plane.db, sim.plane.config, spec().flavors("h100-80g").build(),
                     "t").job.id
    iv = Intervals(admission=0.2, dispatch=0.1, reconcile=0.2, lease_ttl=1.5, prune=0.3)
    runtime = Runtime(sim.plane, LeaderLease(sim.plane.db, holder="r1", ttl=iv.lease_ttl), iv)

    def oldest() -> datetime | None:
        with sim.plane.db.read() as s:
            return s.connection().execute(sa.text("SELECT min(at) FROM admission_cycles")
                                          ).scalar_one_or_none()

    runtime.start()
    try:
        wait_until(lambda: oldest() is not None, 60, "a first admission cycle")
        first = oldest()
        assert first is not None
        wait_until(lambda: (o := oldest()) is not None and o > first, 60,
                   "the oldest cycle to be pruned", interval=0.05, between=lambda: sim.advance(5))
        with sim.plane.db.read() as s:
            explanation = att.get_explanation(s, job)
        assert explanation is not None and "PoolDrained" in explanation[1]
    finally:
        runtime.stop()
