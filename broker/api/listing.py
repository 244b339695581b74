"""What the job routes read beside the job rows: the queued jobs' waits and the page cursor."""

from __future__ import annotations

import base64
import binascii

import sqlalchemy as sa
from sqlmodel import Session

from broker.api.problems import Problem
from broker.api.schemas import WaitOut
from broker.domain import JobState
from broker.domain.ids import is_job_id
from broker.store import attempts as att
from broker.store.in_lists import in_chunks, one_of
from broker.store.records import JobRecord

_WAITS = sa.select(att.EXPLANATIONS.c.job_id, att.EXPLANATIONS.c.at,
                   att.EXPLANATIONS.c.payload_json).where(one_of(att.EXPLANATIONS.c.job_id, "ids"))
"""Built once (every GET of a job, every page of jobs reads it; an array on PostgreSQL)."""


def waits(s: Session, jobs: list[JobRecord]) -> dict[str, WaitOut]:
    """Position and estimate of the QUEUED ones among `jobs`, stored by the admission cycle
    with their verdicts (one query for the page, in the caller's read transaction)."""
    ids = [j.id for j in jobs if j.state == JobState.QUEUED.value]
    if not ids:
        return {}
    rows = [r for chunk in in_chunks(ids)
            for r in s.connection().execute(_WAITS, {"ids": list(chunk)})]
    out: dict[str, WaitOut] = {}
    for job_id, at, payload in rows:
        try:
            out[job_id] = WaitOut.of(at, payload)
        except (ValueError, TypeError):
            continue  # an explanation stored before estimates existed, or unreadable
    return out


def decode_cursor(cursor: str) -> str:
    """The job id a page cursor stands for (422 when it is none of ours)."""
    try:
        value = base64.urlsafe_b64decode(cursor.encode() + b"==").decode()
    except (binascii.Error, UnicodeDecodeError):
        value = ""
    if not is_job_id(value):
        raise Problem(
            422, "invalid-cursor", "Invalid cursor",
            "cursor: pass next_cursor from a previous page",
            [{"field": "cursor", "message": "not a cursor returned by this API"}],
        )
    return value
