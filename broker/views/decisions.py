"""Decision log views: admission cycles (newest first) and the decisions logged for a job.

A job's decision is logged in the cycles where it changed (its admission, a new reason or
message; broker/control/decision_log.py has the details);
`repeated_in` says in how many later cycles, up to the job's next logged decision, it stood
unchanged (while the job waited; once admitted or ended, later cycles did not consider it).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from broker.store import decision_log as store
from broker.store.db import Database

MAX_PAGE = 500


class CycleView(BaseModel):
    id: int
    at: datetime
    leader_epoch: int
    inputs_digest: str
    pending: int
    admitted: int
    waiting: int
    reasons: dict[str, int]
    """Waiting jobs per reason."""
    admitted_to: list[tuple[str, str]]
    """(job, pool) admitted by the cycle."""
    reservations: list[str]
    victims: list[str]
    decisions_logged: int
    """Jobs whose decision changed in this cycle (see the module doc)."""
    repeats: int = 0
    """Idle cycles (no job to decide) after this one, stored as this row: a run of idle
    cycles is one row."""
    last_at: datetime | None = None
    """When the last of those idle cycles ran."""


class PoolVerdictView(BaseModel):
    pool: str
    fits: bool
    reason: str
    message: str


class VictimView(BaseModel):
    job_id: str
    team: str
    pool: str
    gpus: int
    reason: str


class JobDecisionView(BaseModel):
    cycle_id: int
    at: datetime
    inputs_digest: str
    admitted: bool
    reason: str
    message: str
    placement_pool: str | None
    reservation: str | None
    borrowed_gpus: int
    pools: list[PoolVerdictView]
    victims: list[VictimView]
    repeated_in: int
    """Later cycles that repeated this decision before the next logged one (see module doc);
    for the newest decision of a job still waiting: the cycles since."""


def _cycle_view(c: store.CycleRecord, logged: int) -> CycleView:
    rec: dict[str, Any] = json.loads(c.record_json)
    return CycleView(
        id=c.id, at=c.at, leader_epoch=c.leader_epoch, inputs_digest=c.inputs_digest,
        pending=int(rec.get("pending", 0)), admitted=int(rec.get("admitted", 0)),
        waiting=int(rec.get("waiting", 0)),
        reasons={str(k): int(v) for k, v in rec.get("reasons", [])},
        admitted_to=[(str(j), str(p)) for j, p in rec.get("admitted_to", [])],
        reservations=[str(r) for r in rec.get("reservations", [])],
        victims=[str(v) for v in rec.get("victims", [])],
        decisions_logged=logged, repeats=c.repeats, last_at=c.last_at,
    )


def read_cycles(db: Database, limit: int = 50, before_id: int | None = None) -> list[CycleView]:
    """Admission cycles newest first, at most `limit` (<= MAX_PAGE); `before_id`: older ones."""
    with db.read() as s:
        cycles = store.cycles_page(s, max(1, min(limit, MAX_PAGE)), before_id)
        counts = store.logged_counts(s, [c.id for c in cycles])
    return [_cycle_view(c, counts.get(c.id, 0)) for c in cycles]


def _decision_view(r: store.JobDecisionRecord, repeated: int) -> JobDecisionView:
    p: dict[str, Any] = json.loads(r.payload_json)
    placement = p.get("placement") or {}
    return JobDecisionView(
        cycle_id=r.cycle_id, at=r.at, inputs_digest=r.inputs_digest, admitted=r.admitted,
        reason=r.reason, message=str(p.get("message", "")),
        placement_pool=placement.get("pool"), reservation=p.get("reservation"),
        borrowed_gpus=int(p.get("borrowed_gpus", 0)),
        pools=[PoolVerdictView(**v) for v in p.get("pools", [])],
        victims=[VictimView(**v) for v in p.get("victims", [])],
        repeated_in=repeated,
    )


def read_job_decisions(
    db: Database, job_id: str, waiting_until: datetime | None, limit: int = 50,
    before_cycle: int | None = None,
) -> list[JobDecisionView]:
    """A job's logged decisions, newest first. `waiting_until`: when the job stopped waiting
    for admission (None: it waits now), which bounds how long its last decision stood."""
    limit = max(1, min(limit, MAX_PAGE))
    with db.read() as s:
        rows = store.job_decisions(s, job_id, limit, before_cycle)
        out = []
        newer = store.next_logged_cycle(s, job_id, rows[0].cycle_id) if rows else None
        for r in rows:
            repeated = 0
            if not r.admitted:
                until = waiting_until if newer is None else None
                repeated = max(0, store.cycles_between(s, r.cycle_id, newer, until) - 1)
            out.append(_decision_view(r, repeated))
            newer = r.cycle_id
    return out
