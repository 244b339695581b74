"""A preemption takes the victim's job row before its attempt row, the order set_state, the
reconciler and the progress route take them. A preemption that updated the attempt first and
then moved the job deadlocked against a reconcile chunk holding the job row (PostgreSQL aborted
one of them: under the soak, a lost preemption try or a lost reconcile chunk)."""

from __future__ import annotations

import threading

from broker.control.preempt import preempt
from broker.domain import Reason
from broker.domain.clock import utcnow
from broker.store import attempts as att
from broker.store import records
from policies.preemption import Victim
from tests.builders import spec
from tests.fixtures.postgres import POSTGRES_ONLY, lock_waiters
from tests.harness.sim import Sim, consistent, run_until, submit
from tests.harness.wait import wait_until
from tests.integration.control.poison import events

pytestmark = POSTGRES_ONLY  # row-lock order matters only where rows are locked


def test_a_preemption_waits_for_a_reconcile_holding_the_job_row(sim: Sim) -> None:
    job = submit(sim, spec().name("victim").flavors("a100-80g").replicas(1).gpus(2)
                 .topology(None).backend("k8s"), 3600)
    run_until(sim, job, "RUNNING", step=20)
    victim = Victim(job, "vision", "k8s-a100", 2, 30, 0.0, Reason.Preempted, "reclaimed")
    done: list[object] = []

    def stop() -> None:
        try:
            done.append(preempt(sim.plane, victim))
        except Exception as exc:  # a deadlock victim: what the test is about
            done.append(exc)

    stopper = threading.Thread(target=stop)
    with sim.plane.db.write() as s:  # what a reconcile chunk does: job row, then attempt row
        assert records.lock_job(s, job) is not None
        stopper.start()
        wait_until(lambda: lock_waiters(sim.plane.db) >= 1, 60, "the preemption to wait on a lock")
        att.update(s, job, 1, last_seen_at=utcnow())  # raised DeadlockDetected
    stopper.join(timeout=60)
    assert not stopper.is_alive()
    assert done == [True]
    assert ("RETRYING", "Preempted") in [(e[0], e[1]) for e in events(sim, job)]
    consistent(sim)
