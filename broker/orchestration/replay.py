"""Rebuild a job's state, reason and attempt count from its events, and compare with the row."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sqlmodel import Session

from broker.domain import JobState, is_allowed, starts_attempt
from broker.store.queries import events_of_jobs, list_jobs
from broker.store.records import EventRecord, JobRecord


@dataclass(frozen=True, slots=True)
class Replayed:
    state: str
    reason: str
    message: str
    attempt: int
    last_seq: int
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Mismatch:
    job_id: str
    field: str
    stored: object
    replayed: object


def replay(events: Iterable[EventRecord]) -> Replayed:
    """Fold events in seq order. Gaps, bad first events and illegal moves are problems."""
    state: str | None = None
    reason = message = ""
    attempt = seq = 0
    problems: list[str] = []
    for ev in events:
        if ev.seq != seq + 1:
            problems.append(f"event seq {ev.seq} follows {seq}")
        if seq == 0 and (ev.from_state is not None or ev.to_state != JobState.SUBMITTED):
            problems.append("first event is not the SUBMITTED creation")
        elif seq > 0:
            if ev.from_state != state:
                problems.append(f"seq {ev.seq} starts from {ev.from_state}, replay is at {state}")
            if state and not is_allowed(JobState(state), JobState(ev.to_state)):
                problems.append(f"seq {ev.seq}: {state} -> {ev.to_state} is not allowed")
            if starts_attempt(JobState(state) if state else None, JobState(ev.to_state)):
                attempt += 1
        state, reason, message, seq = ev.to_state, ev.reason, ev.message, ev.seq
    if state is None:
        problems.append("no events")
    return Replayed(state or "", reason, message, attempt, seq, tuple(problems))


def compare(job: JobRecord, rep: Replayed) -> list[Mismatch]:
    out = [
        Mismatch(job.id, name, getattr(job, name), getattr(rep, name))
        for name in ("state", "reason", "message", "attempt", "last_seq")
        if getattr(job, name) != getattr(rep, name)
    ]
    out += [Mismatch(job.id, "events", None, p) for p in rep.problems]
    return out


def check_all(session: Session, batch: int = 500) -> Iterator[Mismatch]:
    """Stream every job with its events in id order, in batches; yield each mismatch."""
    after = ""
    while True:
        jobs = list_jobs(session, after_id=after, limit=batch, ascending=True)
        if not jobs:
            return
        ids = [j.id for j in jobs]
        by_job = events_of_jobs(session, ids)
        for job in jobs:
            yield from compare(job, replay(by_job[job.id]))
        after = ids[-1]
