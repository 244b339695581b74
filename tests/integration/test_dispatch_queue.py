"""The dispatcher's queue on both databases: a backend's backlog of old intents never crowds
the other backends' newer intents out of a pass."""

from __future__ import annotations

from datetime import timedelta

from broker.domain import JobState, Reason
from broker.store import Database, utcnow
from broker.store import attempts as att
from tests.builders import insert_job_in_state


def _intent(db: Database, backend: str, age_s: int) -> str:
    with db.write() as s:
        job_id = insert_job_in_state(s, JobState.ADMITTED, Reason.Admitted)
        att.insert_attempt(s, att.AttemptRecord(
            job_id=job_id, number=1, snapshot_json="{}", spec_hash="h",
            backend_name=f"isthmus-{job_id}-1", created_at=utcnow() - timedelta(seconds=age_s),
            backend=backend, pool=f"{backend}-pool", flavor="a100", gpus=8,
            dispatch=att.PENDING, phase="PENDING", preempted=False,
        ))
    return job_id


def test_each_backend_gets_its_share_of_a_pass(db: Database) -> None:
    stuck = [_intent(db, "slow", age_s=100 + i) for i in range(4)]  # the oldest four
    fresh = [_intent(db, "fast", age_s=i) for i in range(2)]
    with db.read() as s:
        got = att.to_dispatch(s, limit=3)
    by_backend = {b: [a.job_id for a in got if a.backend == b] for b in ("slow", "fast")}
    assert set(by_backend["fast"]) == set(fresh)
    assert len(by_backend["slow"]) == 3 and set(by_backend["slow"]) <= set(stuck)
    assert [a.created_at for a in got] == sorted(a.created_at for a in got)  # oldest first
