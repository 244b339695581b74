"""The limit for bench/submit.py: `isthmus server --no-control` as it is (same app, same
uvicorn settings, same request validation, authentication and response), except that a
submission is answered without touching the database: the job record is built in memory
exactly as the durable path builds it (canonical spec, hash, feasibility verdict), then
returned as a 201. Never used outside the benchmark.

Run: python -m bench.submit_limit CONFIG DB_URL PORT [WORKERS]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from broker.api.group_commit import SubmitQueue
from broker.domain import JobState
from broker.domain.clock import utcnow
from broker.domain.ids import new_job_id
from broker.feasibility import feasibility
from broker.orchestration.submission import Submission, Submitted
from broker.store.records import JobRecord


async def _in_memory(
    queue: SubmitQueue, subs: list[Submission]
) -> list[Submitted | Exception]:
    out: list[Submitted | Exception] = []
    for sub in subs:
        spec = sub.spec
        verdict = feasibility(queue.config, spec)
        now = utcnow()
        state = JobState.QUEUED if verdict.ok else JobState.REJECTED
        job = JobRecord(
            id=new_job_id(), name=spec.name, team=spec.team, queue=spec.queue,
            priority=spec.priority, state=state.value, reason=verdict.reason.value,
            message=verdict.message or "", attempt=0, last_seq=3,
            total_gpus=spec.gang.total_gpus, spec_json=spec.canonical_json(),
            spec_hash=spec.spec_hash(), idempotency_key=sub.key, submitted_by=sub.actor,
            created_at=now, updated_at=now,
        )
        out.append(Submitted(job, created=True))
    return out


def worker_app() -> Any:
    """One worker of `--workers N`, answering without storing."""
    from broker.server_workers import worker_app as durable

    SubmitQueue._store = _in_memory  # type: ignore[method-assign, assignment]
    return durable()


def main() -> None:
    config, db_url, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    SubmitQueue._store = _in_memory  # type: ignore[method-assign, assignment]
    from broker.server import run

    run(Path(config), db_url=db_url, port=port, control=False, workers=workers,
        factory="bench.submit_limit:worker_app")


if __name__ == "__main__":
    main()
