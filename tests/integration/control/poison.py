"""Helpers for the isolation tests: jobs whose stored spec was written past the API's checks
(the control loop must not trust it), and a short way to read a job's state and events."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from broker.store import attempts as att
from broker.store import records
from broker.store.queries import get_job, job_events
from tests.harness.sim import Sim


def poison(sim: Sim, job_id: str, *, raw: str | None = None, **fields: Any) -> None:
    """Overwrite fields of a job's stored spec (or the whole text with `raw`) directly in the
    database, as a bug, an old version or a hand edit could, and forget the parsed copy."""
    with sim.plane.db.write() as s:
        row = get_job(s, job_id)
        assert row is not None
        data = json.loads(row.spec_json)
        for path, value in fields.items():
            *parents, leaf = path.split("__")
            target = data
            for p in parents:
                target = target[p]
            target[leaf] = value
        text = raw if raw is not None else json.dumps(data)
        s.connection().execute(
            sa.update(records.JOBS).where(records.JOBS.c.id == job_id).values(spec_json=text)
        )
    sim.plane.soft.specs.pop(job_id, None)


def events(sim: Sim, job_id: str) -> list[tuple[str, str, str]]:
    with sim.plane.db.read() as s:
        return [(e.to_state, e.reason, e.message) for e in job_events(s, job_id)]


def poison_snapshot(sim: Sim, job_id: str, **fields: Any) -> None:
    """Overwrite fields of the spec in the run snapshot of the job's latest attempt (the
    dispatcher renders from it), directly in the database. A stored snapshot never changes,
    so the plane keeps it parsed (SoftState.snapshots): the poisoned one is read as by a
    plane that has not parsed it yet (a restarted one)."""
    with sim.plane.db.write() as s:
        a = att.attempts_of(s, job_id)[-1]
        data = json.loads(a.snapshot_json)
        for path, value in fields.items():
            *parents, leaf = path.split("__")
            target = data["spec"]
            for p in parents:
                target = target[p]
            target[leaf] = value
        att.update(s, job_id, a.number, snapshot_json=json.dumps(data))
    sim.plane.soft.snapshots.pop((job_id, a.number), None)
