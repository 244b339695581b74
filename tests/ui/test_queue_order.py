"""The Queue page's admission order, on both databases (the position inside the stored
explanation, as the column each database computes when the explanation is written)."""

from __future__ import annotations

import json

from broker.domain import JobState
from broker.domain.clock import utcnow
from broker.store import attempts as att
from broker.store.db import Database
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
    assert [r.job.id for r in rows] == [ids[1], ids[0], *sorted(ids[2:])]
    assert [r.wait.position if r.wait else None for r in rows][:2] == [2, 12]
    assert sum(n for n, _ in depth.values()) == 4


def test_a_verdict_without_a_plain_position_is_stored_and_sorts_last(db: Database) -> None:
    """explanations.queue_position never fails the write of a verdict (revision 0011), and
    follows the verdict when it is overwritten."""
    now = utcnow()
    odd = [json.dumps({"position": "3"}), json.dumps({"position": 2.5}),
           json.dumps({"position": 10**12}), json.dumps({"position": -4}), json.dumps({})]
    with db.write() as s:
        ids = [insert_job_in_state(s, JobState.QUEUED) for _ in range(len(odd) + 1)]
        for job_id, payload in zip(ids, odd, strict=False):
            att.save_explanation(s, job_id, now, payload)
        att.save_explanation(s, ids[-1], now, json.dumps({"position": 9}))
    with db.read() as s:
        assert [r.job.id for r in queue.waiting_page(s, None, 1)] == [ids[-1], *sorted(ids[:-1])]
    with db.write() as s:  # the first job's verdict now has a position, the last's none
        att.save_explanation(s, ids[0], now, json.dumps({"position": 1}))
        att.save_explanation(s, ids[-1], now, json.dumps({"position": None}))
    with db.read() as s:
        assert [r.job.id for r in queue.waiting_page(s, None, 1)] == [ids[0], *sorted(ids[1:])]
