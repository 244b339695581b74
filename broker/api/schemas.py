"""Response bodies of the v1 API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from broker.domain import JobState
from broker.store.records import EventRecord, JobRecord
from policies.explain import StartWindow


class CheckpointOut(BaseModel):
    """The latest checkpoint a job's training code reported; its next attempt resumes there."""

    attempt: int
    path: str
    step: int | None
    at: datetime


class WaitOut(BaseModel):
    """Where a queued job stands, as of the last admission cycle that considered it."""

    position: int | None
    """1-based place among waiting jobs in admission order (0: in retry backoff)."""
    team_position: int | None
    estimated_start: datetime | None
    estimate_method: str | None
    """now, releases, preemption, or 'unknown: why' (policies/eta.py)."""
    start_window: StartWindow | None = None
    """Where the start is likely to fall: inside [earliest, latest] for the stated share
    (`coverage`) of jobs (policies/eta.py; None: no window)."""
    as_of: datetime

    @classmethod
    def of(cls, at: datetime, payload_json: str) -> WaitOut:
        x = json.loads(payload_json)
        return cls(
            position=x.get("position"), team_position=x.get("team_position"),
            estimated_start=x.get("estimated_start"), estimate_method=x.get("estimate_method"),
            start_window=x.get("start_window"), as_of=at,
        )


class JobOut(BaseModel):
    id: str
    number: int | None = None
    """The numeric id (what the HPC drop-ins show); None for a job stored before numbers."""
    array_number: int | None = None
    """An array task's array id (its first task's number): the task is ARRAY_INDEX."""
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


    wait: WaitOut | None = None
    """Queue position and estimated start (QUEUED jobs the admission cycle has considered)."""

    @classmethod
    def of(cls, row: JobRecord, wait: WaitOut | None = None) -> JobOut:
        return cls(
            id=row.id, number=row.number, array_number=row.array_number, name=row.name,
            team=row.team, queue=row.queue, priority=row.priority,
            state=JobState(row.state), reason=row.reason, message=row.message,
            attempt=row.attempt, total_gpus=row.total_gpus, submitted_by=row.submitted_by,
            created_at=row.created_at, updated_at=row.updated_at,
            first_useful_work_at=row.first_useful_work_at, spec_hash=row.spec_hash,
            spec=json.loads(row.spec_json), wait=wait,
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
