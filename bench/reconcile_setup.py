"""The setup of bench/reconcile.py: N jobs submitted, admitted, dispatched to the simulator and
seen RUNNING by a first observation, so that the measured passes find N live attempts.

Two ways, the same rows:
- `loop`: the control loop itself (run_dispatch in passes of 500 intents, one transaction per
  intent; a first run_reconcile that turns all N RUNNING in chunks of savepoints), as the
  benchmark did before 2026-12-01 session 4: 40 minutes at 50,000 on a busy machine;
- `bulk` (default): the same per-job functions of the product (dispatch's request,
  SimBackend.submit, the dispatcher's attempt update and transition) with the writes of CHUNK
  jobs queued and sent as one executemany per statement (broker.store.batch.deferred), a
  transaction per chunk; then the reconciler's own `apply_all` of each attempt's first fact
  (its chunks, as run_reconcile applies them).
  Each job is written once by one of them, so grouping its statements changes no row.

Submission and admission are the product's batched paths in both.

A prepared database (`save`, SQLite) can be measured again, by this tree or another: `rebuild`
submits each live attempt to a fresh simulator again, in the order it was dispatched, and
moves its clock as `prepare` did, so the simulator holds the same jobs as the database.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from backends.sim.backend import SimBackend
from broker.config import IsthmusConfig
from broker.control import dispatch as dispatch_mod
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.control.reconcile_apply import apply_all
from broker.control.requeue import DISPATCHER
from broker.domain import JobState, Reason
from broker.domain.spec import JobSpec
from broker.orchestration.rules import Cause
from broker.orchestration.submission import Submission, submit_many
from broker.orchestration.transitions import set_state
from broker.store import attempts as att
from broker.store import batch
from broker.store.queries import jobs_by_ids
from broker.store.secrets import digest, progress_token, server_secret

CHUNK = 1000


@dataclass
class SetupTimes:
    submit: float = 0.0
    admit: float = 0.0
    dispatch: float = 0.0
    first: float = 0.0

    def line(self, n: int) -> str:
        return (f"setup: submit {self.submit:.1f}s, admission of {n} {self.admit:.1f}s, "
                f"dispatch {self.dispatch:.1f}s, first reconcile (all -> RUNNING) "
                f"{self.first:.1f}s")


def prepare(plane: ControlPlane, config: IsthmusConfig, sim: SimBackend, n: int,
            spec: Callable[[int], JobSpec], *, bulk: bool, dispatch_passes: int = 0
            ) -> SetupTimes:
    """Submit, admit, dispatch and observe once `n` jobs (see the module docstring)."""
    times = SetupTimes()
    t0 = time.perf_counter()
    for start in range(0, n, 2000):
        submit_many(plane.db, config, [Submission(spec(i), "bench")
                                       for i in range(start, min(n, start + 2000))])
    times.submit = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_admission(plane, limit=n)  # the whole backlog in one cycle
    times.admit = time.perf_counter() - t0
    t0 = time.perf_counter()
    if bulk:
        dispatch_bulk(plane, sim, n)
    else:
        passes = 0
        while run_dispatch(plane) and (passes := passes + 1) != dispatch_passes:
            pass
    times.dispatch = time.perf_counter() - t0
    sim.clock.advance(60)
    sim.sync()
    t0 = time.perf_counter()
    if bulk:
        first_observation_bulk(plane, sim)
    else:
        run_reconcile(plane, sim.name)  # first pass: every job turns RUNNING
    times.first = time.perf_counter() - t0
    return times


def dispatch_bulk(plane: ControlPlane, sim: SimBackend, n: int) -> None:
    """What run_dispatch does for a fresh intent (no object to adopt), CHUNK intents per
    transaction with their writes grouped."""
    key = server_secret(plane.db, "progress")
    with plane.db.read() as s:
        intents = att.to_dispatch(s, limit=n)
    for start in range(0, len(intents), CHUNK):
        chunk = intents[start:start + CHUNK]
        with plane.db.read() as s:
            jobs = dict(jobs_by_ids(s, [a.job_id for a in chunk]))
        made = []
        for a in chunk:
            job = jobs.get(a.job_id)
            if job is None or job.state != JobState.ADMITTED or job.attempt != a.number:
                continue
            token = progress_token(key, a.job_id, a.number)
            request = dispatch_mod._request(plane, a, token, owner=job.submitted_by)
            made.append((a, token, sim.submit(request)))
        now = plane.clock()
        with plane.db.write() as s, batch.deferred(s):
            for a, token, result in made:
                att.update(s, a.job_id, a.number, dispatch=att.CREATED,
                           backend_id=result.backend_id, dispatched_at=now,
                           progress_token_sha256=digest(token),
                           rendered=dispatch_mod.as_text(result.rendered))
                set_state(s, a.job_id, JobState.PREPARING, Reason.BackendPending,
                          Cause("dispatcher", DISPATCHER, key=f"dispatched:{a.number}"),
                          f"created {a.backend_name} on {a.backend} ({result.backend_id})",
                          now=now)


def first_observation_bulk(plane: ControlPlane, sim: SimBackend) -> None:
    """The reconciler's first look at every attempt (all changed): the facts applied by its
    `apply_all`, a chunk of attempts per transaction with their writes grouped."""
    now = plane.clock()
    facts = {f.backend_name: f for f in sim.observe()}
    with plane.db.read() as s:
        keys = [(b.job_id, b.number) for b in att.dispatched_brief(s, sim.name)]
        live = att.by_keys(s, keys)
    apply_all(plane, [(a, facts[a.backend_name]) for a in live if a.backend_name in facts], now)


def save(db_file: str, path: str) -> None:
    """A copy of the SQLite database `db_file` at `path`, for `rebuild` (SQLite's backup:
    consistent while the database is open)."""
    with contextlib.closing(sqlite3.connect(db_file)) as src, \
            contextlib.closing(sqlite3.connect(path)) as dst:
        src.backup(dst)


def rebuild(plane: ControlPlane, sim: SimBackend) -> int:
    """The simulator's jobs of a prepared database (see the module docstring); how many."""
    key = server_secret(plane.db, "progress")
    with plane.db.read() as s:
        live = att.by_keys(s, [(b.job_id, b.number)
                               for b in att.dispatched_brief(s, sim.name)])
        jobs = dict(jobs_by_ids(s, [a.job_id for a in live]))
    live.sort(key=lambda a: int((a.backend_id or "-0").rsplit("-", 1)[1]))
    for a in live:
        job = jobs[a.job_id]
        assert job is not None
        token = progress_token(key, a.job_id, a.number)
        sim.submit(dispatch_mod._request(plane, a, token, owner=job.submitted_by))
    sim.clock.advance(60)
    sim.sync()
    return len(live)
