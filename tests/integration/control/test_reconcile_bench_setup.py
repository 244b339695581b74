"""The reconcile benchmark's bulk setup (bench/reconcile_setup.py) writes what the control
loop's own dispatch and first reconcile pass write, row for row: the measured passes of the
benchmark then start from the same database either way. A database it saved, measured again,
finds the simulator rebuilt as it was."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backends.sim.backend import SimBackend, SimClock, SimPoolSpec
from bench.reconcile import CONFIG, spec
from bench.reconcile_setup import prepare, rebuild, save
from broker.config import parse_config
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.store import open_database
from broker.store.attempts import ATTEMPTS, FACTS
from broker.store.db import Database
from broker.store.records import EVENTS, JOBS
from broker.store.tables import LEDGER_ENTRIES as ENTRIES

N = 30
SIM_START = datetime(2026, 11, 29, tzinfo=UTC)
SIM_END = SIM_START + timedelta(days=1)


def _plane(path: Path) -> tuple[ControlPlane, SimBackend]:
    db = open_database(f"sqlite:///{path}")
    clock = SimClock(SIM_START)
    sim = SimBackend("sim", "slurm", [SimPoolSpec("big", "a100-80g", blocks=1,
                     racks_per_block=2, nodes_per_rack=25)], clock, seed=1)
    return ControlPlane(db, parse_config(CONFIG), {"sim": sim}, clock=lambda: clock.now), sim


def _setup(path: Path, *, bulk: bool) -> dict[str, list[tuple[Any, ...]]]:
    plane, sim = _plane(path)
    prepare(plane, plane.config, sim, N, spec, bulk=bulk)
    return _rows(plane.db)


def _rows(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    with db.read() as s:
        c = s.connection()
        names: dict[str, str] = {r[0]: r[1] for r in c.execute(sa.select(JOBS.c.id, JOBS.c.name))}

        def named(v: Any) -> Any:  # job ids (random, also inside object names) as job names
            if isinstance(v, str):
                for job_id, name in names.items():
                    v = v.replace(job_id, name).replace(job_id.lower(), name)
            return v

        def rows(stmt: Any) -> list[tuple[Any, ...]]:
            return sorted(tuple(map(named, r)) for r in c.execute(stmt).all())

        facts = {fid: names[job] for fid, job in c.execute(sa.select(FACTS.c.id, FACTS.c.job_id))}
        # the submission's events carry the wall clock, the rest the simulator's
        events = [(*r[:-2], r[-2] if r[-2] < SIM_END else None,
                   r[-1] and facts[int(r[-1].split(":")[1])])
                  for r in rows(sa.select(
                      EVENTS.c.job_id, EVENTS.c.seq, EVENTS.c.from_state, EVENTS.c.to_state,
                      EVENTS.c.reason, EVENTS.c.message, EVENTS.c.cause_kind, EVENTS.c.actor,
                      EVENTS.c.attempt, EVENTS.c.at, EVENTS.c.facts_ref))]
        return {
            "jobs": rows(sa.select(JOBS.c.name, JOBS.c.state, JOBS.c.reason, JOBS.c.message,
                                   JOBS.c.attempt, JOBS.c.last_seq, JOBS.c.updated_at,
                                   JOBS.c.first_useful_work_at)),
            "events": events,
            "attempts": rows(sa.select(
                ATTEMPTS.c.job_id, ATTEMPTS.c.number, ATTEMPTS.c.backend_name,
                ATTEMPTS.c.dispatch, ATTEMPTS.c.backend_id, ATTEMPTS.c.phase,
                ATTEMPTS.c.dispatched_at, ATTEMPTS.c.started_at, ATTEMPTS.c.last_seen_at,
                ATTEMPTS.c.ended_at, ATTEMPTS.c.rendered, ATTEMPTS.c.resolved_json,
                ATTEMPTS.c.progress_token_sha256.is_not(None))),
            "facts": rows(sa.select(FACTS.c.job_id, FACTS.c.backend_name, FACTS.c.phase,
                                    FACTS.c.reason, FACTS.c.observed_at, FACTS.c.payload_json)),
            "ledger": rows(sa.select(ENTRIES.c.job_id, ENTRIES.c.attempt, ENTRIES.c.kind,
                                     ENTRIES.c.gpus, ENTRIES.c.gpu_hours, ENTRIES.c.at)),
        }


def test_the_bulk_setup_writes_what_the_control_loop_writes(tmp_path: Path) -> None:
    loop = _setup(tmp_path / "loop.db", bulk=False)
    bulk = _setup(tmp_path / "bulk.db", bulk=True)
    assert [r[1:3] for r in loop["jobs"]] == [("RUNNING", "Running")] * N
    assert len(loop["events"]) == 6 * N  # SUBMITTED .. ADMITTED, PREPARING, RUNNING
    for table in loop:
        assert bulk[table] == loop[table], table


def test_a_saved_database_measured_again_finds_the_simulator_as_it_left_it(
        tmp_path: Path) -> None:
    plane, sim = _plane(tmp_path / "first.db")
    prepare(plane, plane.config, sim, N, spec, bulk=True)
    save(str(tmp_path / "first.db"), str(tmp_path / "saved.db"))
    again, sim2 = _plane(tmp_path / "saved.db")
    assert rebuild(again, sim2) == N
    assert sim2.clock.now == sim.clock.now
    assert list(sim2.observe()) == list(sim.observe())  # same jobs, nodes, times, ids
    idle = run_reconcile(again, "sim")
    assert (idle.observed, idle.transitions) == (N, 0)
    for s in (sim, sim2):
        s.clock.advance(3600)
        s.sync()
    assert run_reconcile(again, "sim").transitions == run_reconcile(plane, "sim").transitions > 0
    assert _rows(again.db)["jobs"] == _rows(plane.db)["jobs"]
