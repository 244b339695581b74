"""Response bodies of the v1 API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from broker.domain import JobState
from broker.store.records import EventRecord, JobRecord


class CheckpointOut(BaseModel):
    """The latest checkpoint a job's training code reported; its next attempt resumes there."""

    attempt: int
    path: str
    step: int | None
    at: datetime


class JobOut(BaseModel):
    id: str
    name: str
    team: str
    queue: str
    priority: str
    state: JobState
    reason: str
    message: str
    attempt: int
    total_gpus: int
    submitted_by: str
    created_at: datetime
    updated_at: datetime
    first_useful_work_at: datetime | None
    spec_hash: str
    spec: dict[str, Any]
    last_checkpoint: CheckpointOut | None = None
    """Filled by GET /v1/jobs/{id} (not in lists)."""

    @classmethod
    def of(cls, row: JobRecord) -> JobOut:
        return cls(
            id=row.id, name=row.name, team=row.team, queue=row.queue, priority=row.priority,
            state=JobState(row.state), reason=row.reason, message=row.message,
            attempt=row.attempt, total_gpus=row.total_gpus, submitted_by=row.submitted_by,
            created_at=row.created_at, updated_at=row.updated_at,
            first_useful_work_at=row.first_useful_work_at, spec_hash=row.spec_hash,
            spec=json.loads(row.spec_json),
        )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class EventOut(BaseModel):
    seq: int
    at: datetime
    from_state: JobState | None
    to_state: JobState
    reason: str
    message: str
    actor: str
    cause: str
    attempt: int

    @classmethod
    def of(cls, row: EventRecord) -> EventOut:
        return cls(
            seq=row.seq, at=row.at,
            from_state=JobState(row.from_state) if row.from_state else None,
            to_state=JobState(row.to_state), reason=row.reason, message=row.message,
            actor=row.actor, cause=row.cause_kind, attempt=row.attempt,
        )


class Health(BaseModel):
    status: str
    database: str
    version: str
    control: str  # "leader", "standby" or "off"
    epoch: int | None = None
