"""The ``{job_id}`` of the jobs API: an Isthmus id, the job's number, or ``ARRAY_TASK``.

Routes take ``job_id: JobRef`` and receive the Isthmus id, so everything after the path reads
the store by that id as before. A reference no job has is passed on as written: the route's
own look-up answers 404 for it, as for an unknown id (the same answer for another team's job).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from broker.domain.ids import is_job_id
from broker.store import job_numbers
from broker.store.db import Database


async def canonical_job_id(job_id: str, request: Request) -> str:
    """Async on purpose: an id (most requests) is answered on the event loop; only a number
    is looked up, in a worker thread (a sync dependency costs every request that hop)."""
    if is_job_id(job_id) or job_numbers.parse_ref(job_id) is None:
        return job_id
    return await run_in_threadpool(_resolve, request.app.state.db, job_id)


def _resolve(db: Database, ref: str) -> str:
    with db.read() as s:
        return job_numbers.resolve(s, ref) or ref


JobRef = Annotated[str, Depends(canonical_job_id)]
