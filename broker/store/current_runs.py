"""A read model for the HPC drop-ins: each job's current attempt with what its backend last said
(nodes, exit code, start and end), so isqueue and isacct need one request, not one per job."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.store import attempts as att
from broker.store.records import EVENTS


def current_runs(session: Session, jobs: Sequence[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """``{job_id: run}`` for (job id, current attempt number) pairs; jobs never dispatched have
    no entry. ``run`` holds backend, pool, flavor, backend_id, started_at, ended_at, failure and,
    from the latest fact, nodes, exit_code, signal and raw_state."""
    if not jobs:
        return {}
    wanted = dict(jobs)
    ids = list(wanted)
    conn = session.connection()
    out: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        sa.select(att.ATTEMPTS.c.job_id, att.ATTEMPTS.c.number, att.ATTEMPTS.c.backend,
                  att.ATTEMPTS.c.pool, att.ATTEMPTS.c.flavor, att.ATTEMPTS.c.backend_id,
                  att.ATTEMPTS.c.started_at, att.ATTEMPTS.c.ended_at, att.ATTEMPTS.c.failure)
        .where(att.ATTEMPTS.c.job_id.in_(ids))
    )
    for r in rows:
        if wanted.get(r.job_id) != r.number:
            continue
        out[r.job_id] = {
            "attempt": r.number, "backend": r.backend, "pool": r.pool, "flavor": r.flavor,
            "backend_id": r.backend_id, "failure": r.failure,
            "started_at": r.started_at.isoformat() if r.started_at else None,
            "ended_at": r.ended_at.isoformat() if r.ended_at else None,
            "nodes": [], "exit_code": None, "signal": None, "raw_state": None,
        }
    facts = conn.execute(
        sa.select(att.FACTS.c.job_id, att.FACTS.c.attempt, att.FACTS.c.payload_json)
        .where(att.FACTS.c.job_id.in_(ids))
        .order_by(att.FACTS.c.id)
    )
    for f in facts:  # oldest first: the latest fact of the current attempt wins
        run = out.get(f.job_id)
        if run is None or f.attempt != run["attempt"]:
            continue
        data = json.loads(f.payload_json)
        if data.get("nodes"):
            run["nodes"] = list(data["nodes"])
        for key in ("exit_code", "signal", "raw_state"):
            if data.get(key) is not None:
                run[key] = data[key]
        for key in ("started_at", "ended_at"):
            if run[key] is None and data.get(key):
                run[key] = data[key]
    return out


def cancellers(session: Session, job_ids: Sequence[str]) -> dict[str, str]:
    """``{job_id: actor}``: who cancelled each of these (cancelled) jobs, from the event that
    made it CANCELLED (a user's name, or ``system:...`` when the broker did)."""
    if not job_ids:
        return {}
    rows = session.connection().execute(
        sa.select(EVENTS.c.job_id, EVENTS.c.actor)
        .where(EVENTS.c.job_id.in_(list(job_ids)), EVENTS.c.to_state == "CANCELLED"))
    return {r.job_id: r.actor for r in rows}
