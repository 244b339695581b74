"""The Queue page's admission order, on both databases (the position is read from the stored
explanation with each database's own JSON function)."""

from __future__ import annotations

import json

from broker.domain import JobState
from broker.store import attempts as att
from broker.store.db import Database
from broker.store.tables import utcnow
from broker.ui import queue
from tests.builders import insert_job_in_state


def test_waiting_jobs_come_in_admission_order(db: Database) -> None:
    now = utcnow()
    with db.write() as s:
        ids = [insert_job_in_state(s, JobState.QUEUED) for _ in range(4)]
        insert_job_in_state(s, JobState.RUNNING)
        for job_id, position in zip(ids, (12, 2, 0, None), strict=True):
            if position is not None:
                payload = {"position": position, "team_position": 1, "estimated_start": None,
                           "estimate_method": "unknown: test"}
                att.save_explanation(s, job_id, now, json.dumps(payload))
    with db.read() as s:
        assert queue.count_waiting(s, None) == 4
        assert queue.count_waiting(s, "other-team") == 0
        rows = queue.waiting_page(s, None, 1)
        depth = queue.waiting_by_team(s, None)
    # ordered positions first (2 before 12: numbers, not text), then backoff and unconsidered
    # jobs by id
    assert [r.job.id for r in rows] == [ids[1], ids[0], ids[2], ids[3]]
    assert [r.wait.position if r.wait else None for r in rows] == [2, 12, 0, None]
    assert sum(n for n, _ in depth.values()) == 4
