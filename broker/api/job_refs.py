"""The ``{job_id}`` of the jobs API: an Isthmus id, the job's number, or ``ARRAY_TASK``.

Routes take ``job_id: JobRef`` and receive the Isthmus id, so everything after the path reads
the store by that id as before. A reference no job has is passed on as written: the route's
own look-up answers 404 for it, as for an unknown id (the same answer for another team's job).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from broker.domain.ids import is_job_id
from broker.store import job_numbers
from broker.store.db import Database


def canonical_job_id(job_id: str, request: Request) -> str:
    if is_job_id(job_id) or job_numbers.parse_ref(job_id) is None:
        return job_id
    db: Database = request.app.state.db
    with db.read() as s:
        return job_numbers.resolve(s, job_id) or job_id


JobRef = Annotated[str, Depends(canonical_job_id)]
