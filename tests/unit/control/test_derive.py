"""derive: a running job seen running again gets its reason back (after an outage)."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.control.derive import Step, derive
from broker.domain import JobState, Reason
from broker.domain.facts import Fact, Phase


def _running() -> Fact:
    return Fact(backend="b", backend_name="isthmus-x-1", job_id="x", attempt=1,
                phase=Phase.RUNNING, reason=Reason.Running, nodes=("n1",),
                observed_at=datetime(2026, 11, 29, tzinfo=UTC))


def test_running_again_is_a_reason_update_to_running() -> None:
    d = derive(JobState.RUNNING, _running())
    assert d.steps == (Step(JobState.RUNNING, Reason.Running, "all ranks run on n1"),)
    assert d.started and not d.ended


def test_first_seen_running_goes_through_preparing() -> None:
    d = derive(JobState.ADMITTED, _running())
    assert [s.state for s in d.steps] == [JobState.PREPARING, JobState.RUNNING]
