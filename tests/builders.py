"""Readable builders for test data: spec().replicas(4).gpus(8).flavors("h100-80g").build()."""

from __future__ import annotations

import copy
from typing import Any

from sqlmodel import Session

from broker.domain import JobSpec, JobState, Reason
from broker.domain.clock import utcnow
from broker.domain.ids import new_job_id
from broker.orchestration.rules import Cause
from broker.orchestration.transitions import append_event
from broker.store import records
from broker.store.records import JobRecord

CANONICAL: dict[str, Any] = {
    "name": "llama-ft", "team": "vision", "priority": "normal",
    "gang": {"replicas": 2, "gpus_per_replica": 8},
    "flavors": ["h100-80g", "a100-80g"], "topology": {"required": "rack"},
    "backend": "any",
    "entrypoint": {"image": "registry.local/train:1.0", "command": ["python", "train.py"]},
    "max_runtime": "2h", "retry": {"max_attempts": 3},
}


class SpecBuilder:
    def __init__(self) -> None:
        self.data: dict[str, Any] = copy.deepcopy(CANONICAL)

    def name(self, n: str) -> SpecBuilder:
        self.data["name"] = n
        return self

    def team(self, t: str) -> SpecBuilder:
        self.data["team"] = t
        return self

    def replicas(self, n: int) -> SpecBuilder:
        self.data["gang"]["replicas"] = n
        return self

    def gpus(self, n: int) -> SpecBuilder:
        self.data["gang"]["gpus_per_replica"] = n
        return self

    def flavors(self, *names: str) -> SpecBuilder:
        self.data["flavors"] = list(names)
        return self

    def topology(self, required: str | None) -> SpecBuilder:
        self.data["topology"] = {"required": required} if required else {}
        return self

    def backend(self, kind: str) -> SpecBuilder:
        self.data["backend"] = kind
        return self

    def set(self, key: str, value: Any) -> SpecBuilder:
        self.data[key] = value
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)

    def build(self) -> JobSpec:
        return JobSpec.model_validate(self.data)


def spec() -> SpecBuilder:
    return SpecBuilder()


def insert_job_in_state(session: Session, state: JobState, reason: Reason | None = None) -> str:
    """Test-only: a job row sitting in `state`, with a consistent one-event history."""
    now = utcnow()
    s = spec().build()
    job = JobRecord(
        id=new_job_id(), name=s.name, team=s.team, queue=s.queue, priority=s.priority,
        state=JobState.SUBMITTED.value, reason=Reason.Submitted.value, message="", attempt=0,
        last_seq=0, total_gpus=s.gang.total_gpus, spec_json=s.canonical_json(),
        spec_hash=s.spec_hash(), idempotency_key=None, submitted_by="test", created_at=now,
        updated_at=now, unsaved_events=[],
    )
    append_event(
        session, job, None, JobState.SUBMITTED, Reason.Submitted, "", Cause("test", "t"), now
    )
    records.insert_new_job(session, job)
    job.state = state.value
    job.reason = (reason or Reason.Submitted).value
    records.save_state(session, job)
    return job.id
