"""A job that keeps waiting for the same thing costs no write per cycle: its row, event, logged
decision and reason message stay as written when only the figures of its message moved; a new
reason is written with its event (broker.domain.reason_messages)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.config import parse_config
from broker.control.admission import cycle_inputs, decide
from broker.store import decision_log
from broker.store.queries import get_job, job_events
from broker.store.records import JobRecord
from tests.builders import SpecBuilder, spec
from tests.harness.sim import CONFIG, Sim, consistent, cycle, state, submit


def _language(replicas: int, gpus: int, name: str) -> SpecBuilder:
    return (spec().name(name).team("language").flavors("h100-80g").topology(None)
            .replicas(replicas).gpus(gpus))


def _job(sim: Sim, job_id: str) -> tuple[JobRecord, int]:
    with sim.plane.db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        return job, len(job_events(s, job_id))


def _logged(sim: Sim, job_id: str) -> int:
    with sim.plane.db.read() as s:
        return len(decision_log.job_decisions(s, job_id, limit=1000))


def test_figures_alone_are_not_written_and_a_new_reason_is(sim: Sim) -> None:
    # language owns no h100 GPUs and may borrow 16: with 8 borrowed, 16 more are over its limit
    first = submit(sim, _language(1, 8, "first"), duration=3600)
    cycle(sim)
    assert state(sim, first)[0] in ("PREPARING", "RUNNING")
    waiting = submit(sim, _language(2, 8, "waiting"), duration=60)
    cycle(sim)
    job, events = _job(sim, waiting)
    assert (job.state, job.reason) == ("QUEUED", "BorrowLimitReached")
    assert "uses 8 of 0 nominal" in job.message, job.message
    logged = _logged(sim, waiting)

    # 4 more GPUs borrowed by a job behind it: the waiting job's figures move, its reason not
    behind = submit(sim, _language(1, 4, "behind"), duration=3600)
    cycle(sim)
    assert state(sim, behind)[0] in ("ADMITTED", "PREPARING", "RUNNING")
    result, _ = decide(sim.plane, cycle_inputs(sim.plane, sim.plane.clock(), fold_usage=False))
    now = next(d for d in result.decisions if d.job_id == waiting)
    assert now.reason.value == "BorrowLimitReached"
    assert "uses 12 of 0 nominal" in now.message and now.message != job.message
    for _ in range(3):
        cycle(sim)
    after, events_after = _job(sim, waiting)
    assert (after.reason, after.message, after.updated_at) == (
        job.reason, job.message, job.updated_at)
    assert events_after == events
    assert _logged(sim, waiting) == logged

    # the borrowing limit goes to 0: a new reason, written with its event and logged
    raw = {**CONFIG, "teams": [
        CONFIG["teams"][0],
        {**CONFIG["teams"][1], "quotas": {"h100-80g": {"nominal": 0, "borrowing_limit": 0},
                                          "a100-80g": {"nominal": 16}}}]}
    sim.plane.config = parse_config(raw)
    cycle(sim)
    changed, events_changed = _job(sim, waiting)
    assert (changed.state, changed.reason) == ("QUEUED", "QuotaExhausted")
    assert "its borrowing limit is 0" in changed.message
    assert events_changed == events + 1
    with sim.plane.db.read() as s:
        last = job_events(s, waiting)[-1]
    assert (last.from_state, last.to_state, last.reason, last.message) == (
        "QUEUED", "QUEUED", "QuotaExhausted", changed.message)
    assert _logged(sim, waiting) == logged + 1
    consistent(sim)  # the row is what its events replay to


def test_a_cycle_without_estimates_keeps_what_is_stored(
        sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue is estimated every ESTIMATE_EVERY_S. A cycle in between writes no estimate
    and forgets none of those stored, so the next estimating cycle rewrites only what moved,
    not every waiting job's explanation again."""
    from broker.control import admission, admission_writes

    def h100(name: str, replicas: int) -> SpecBuilder:
        return spec().name(name).flavors("h100-80g").topology(None).replicas(replicas).gpus(8)

    for i in range(4):  # the whole h100 pool
        submit(sim, h100(f"hold{i}", 1), duration=3600)
    cycle(sim)
    waiting = [submit(sim, h100(f"w{i}", 2), duration=60) for i in range(4)]
    admission.run_admission(sim.plane)  # estimates the queue: stores the four
    assert set(sim.plane.soft.estimated) == set(waiting)
    refreshed: list[str] = []
    original = admission_writes.refresh

    def counting(plane: object, decisions: list[Any], *args: Any) -> None:
        refreshed.extend(d.job_id for d in decisions)
        original(plane, decisions, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(admission_writes, "refresh", counting)
    sim.advance(admission.ESTIMATE_EVERY_S / 3)
    admission.run_admission(sim.plane)  # no estimates made
    assert set(sim.plane.soft.estimated) == set(waiting)
    sim.advance(admission.ESTIMATE_EVERY_S)
    admission.run_admission(sim.plane)  # estimates again: nothing has moved
    assert refreshed == []
    assert set(sim.plane.soft.estimated) == set(waiting)
