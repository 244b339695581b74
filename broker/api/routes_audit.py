"""GET /v1/admin/audit: the audit log (admins), filtered and paged, or exported as JSON lines.
There is no route that changes or deletes a record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from broker.api.problems import Problem, problem_responses
from broker.api.routes_admin import Admin
from broker.store import audit_log
from broker.store.db import Database

router = APIRouter(prefix="/v1/admin", tags=["admin"],
                   responses=problem_responses(401, 403, 422))

JSONL = "application/jsonl"
_JSONL_TYPES = (JSONL, "application/x-ndjson", "application/jsonlines")
EXPORT_BATCH = 1000


class AuditRecordOut(BaseModel):
    seq: int = Field(description="the record's place in the chain, from 1")
    at: str = Field(description="the database's clock when it was written (UTC)")
    actor: str = Field(description="the token's or user's name; (unauthenticated) if none")
    actor_team: str | None
    actor_admin: bool
    action: str = Field(description="job.submit, job.cancel, pool.drain, job.approve, read, "
                        "...")
    method: str
    route: str = Field(description="the route's template, as /v1/jobs/{job_id}/cancel")
    target: str = Field(description="job:ID, pool:NAME, team:NAME, all-teams, ...")
    outcome: Literal["allowed", "refused"]
    status: int = Field(description="the HTTP status answered")
    request_id: str = Field(description="the X-Request-ID of the request")
    detail: dict[str, Any] | None
    prev_hash: str
    hash: str = Field(description="SHA-256 of prev_hash and this record's content")


class AuditPage(BaseModel):
    items: list[AuditRecordOut]
    next_cursor: str | None = Field(description="pass as cursor for the next (older) page")


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isdigit() or len(cursor) > 18:
        raise Problem(422, "invalid-cursor", "Invalid cursor",
                      "cursor: pass next_cursor from a previous page",
                      [{"field": "cursor", "message": "not a cursor returned by this API"}])
    return int(cursor)


def _export(db: Database, filters: audit_log.Filters) -> Iterator[bytes]:
    """Every matching record, oldest first, one JSON object a line, read in batches (each
    its own short read: records are only ever appended)."""
    after = 0
    while True:
        with db.read() as s:
            rows = audit_log.oldest_first(s, filters, after, EXPORT_BATCH)
        if not rows:
            return
        yield b"".join(json.dumps(r.as_dict(), separators=(",", ":")).encode() + b"\n"
                       for r in rows)
        after = rows[-1].seq


Name = Annotated[str | None, Query(max_length=255)]


@router.get(
    "/audit", response_model=AuditPage,
    responses={200: {"content": {JSONL: {}},
                     "description": "a page of records, or (format=jsonl) every match"}},
)
def audit(
    request: Request, caller: Admin,
    actor: Name = None,
    action: Annotated[str | None, Query(max_length=40)] = None,
    target: Annotated[str | None, Query(max_length=255, description="job:ID, pool:NAME, "
                                        "team:NAME, ...")] = None,
    since: Annotated[datetime | None, Query(description="ISO time, inclusive (UTC unless "
                                            "given)")] = None,
    until: Annotated[datetime | None, Query(description="ISO time, exclusive")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=20)] = None,
    format: Annotated[Literal["json", "jsonl"] | None,
                      Query(description="jsonl: every matching record, oldest first, one "
                            "JSON object a line (as Accept: application/jsonl)")] = None,
) -> AuditPage | Response:
    """The audit log, newest first: every state-changing call (submit, cancel, hold,
    release, requeue, signal, approve, refuse, drain, undrain, notice retry) and every read
    of another team's data by an admin, with its actor, time, target, outcome and request
    id. Records are never changed or deleted; `isthmus db check` verifies their hash chain."""
    t0, t1 = _utc(since), _utc(until)
    if t0 is not None and t1 is not None and t1 <= t0:
        raise Problem(422, "invalid-request", "Invalid request", "until: must be after since",
                      [{"field": "until", "message": "must be after since"}])
    filters = audit_log.Filters(actor, action, target, t0, t1)
    db: Database = request.app.state.db
    audit_log.link_before_reading(db)  # every answered call's record is listed
    accept = request.headers.get("accept", "")
    if format == "jsonl" or (format is None and any(t in accept for t in _JSONL_TYPES)):
        return StreamingResponse(_export(db, filters), media_type=JSONL)
    with db.read() as s:
        rows = audit_log.listing(s, filters, limit + 1, _cursor(cursor))
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(items=[AuditRecordOut(**r.as_dict()) for r in rows],
                     next_cursor=str(rows[-1].seq) if more else None)
