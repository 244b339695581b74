"""squeue --start's column for a job held for its --begin time shows that time (Slurm does), not
N/A; an estimate later than the begin time wins; a running job keeps its real start."""

from __future__ import annotations

from typing import Any

from broker.dropins import jobview

BEGIN = "2026-12-05T09:00:00+00:00"


def _item(state: str = "QUEUED", estimated: str | None = None,
          started: str | None = None) -> dict[str, Any]:
    return {"id": "06h46a", "name": "n", "submitted_by": "u", "team": "vision", "state": state,
            "reason": "BeginTimeNotReached", "created_at": "2026-12-04T20:00:00+00:00",
            "spec": {"gang": {"replicas": 1, "gpus_per_replica": 8}, "max_runtime": 3600,
                     "scheduling": {"begin_at": BEGIN}},
            "wait": {"estimated_start": estimated} if estimated else None,
            "run": {"started_at": started} if started else None}


def test_a_job_held_for_its_begin_time_shows_that_time() -> None:
    v = jobview.view(_item())
    assert v.estimated_start is not None and v.estimated_start.isoformat() == BEGIN
    later = jobview.view(_item(estimated="2026-12-05T10:00:00+00:00"))
    assert later.estimated_start is not None and later.estimated_start.hour == 10
    running = jobview.view(_item(state="RUNNING", started="2026-12-05T09:01:00+00:00"))
    assert running.estimated_start is None and running.start is not None
