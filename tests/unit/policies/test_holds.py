"""policies.holds: start times, dependencies and array limits before admission (table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.domain.reasons import Reason
from broker.domain.scheduling import Scheduling
from policies.holds import Held, JobRef, hold, holds_for

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
T0 = NOW - timedelta(hours=1)


def held(job_id: str = "j", name: str = "n", **sched: Any) -> Held:
    return Held(job_id, name, "alice", NOW, Scheduling.model_validate(sched))


def ref(job_id: str, state: str, name: str = "other", array: str | None = None) -> JobRef:
    return JobRef(job_id, state, name, "alice", T0, array)


def deps(kind: str, *ids: str) -> dict[str, object]:
    return {"dependencies": [{"kind": kind, "jobs": list(ids)}]}


@pytest.mark.parametrize(
    ("sched", "others", "reason"),
    [
        ({"begin_at": NOW + timedelta(minutes=5)}, [], Reason.BeginTimeNotReached),
        ({"begin_at": NOW - timedelta(minutes=5)}, [], None),
        (deps("afterok", "p"), [ref("p", "RUNNING")], Reason.WaitingForDependency),
        (deps("afterok", "p"), [ref("p", "SUCCEEDED")], None),
        (deps("afterok", "p"), [ref("p", "FAILED")], Reason.DependencyNeverSatisfied),
        (deps("afterok", "p"), [], Reason.DependencyNeverSatisfied),
        (deps("afternotok", "p"), [ref("p", "CANCELLED")], None),
        (deps("afternotok", "p"), [ref("p", "SUCCEEDED")], Reason.DependencyNeverSatisfied),
        (deps("afterany", "p", "q"), [ref("p", "FAILED"), ref("q", "QUEUED")],
         Reason.WaitingForDependency),
        (deps("afterany", "p", "q"), [ref("p", "FAILED"), ref("q", "SUCCEEDED")], None),
        (deps("after", "p"), [ref("p", "QUEUED")], Reason.WaitingForDependency),
        (deps("after", "p"), [ref("p", "RUNNING")], None),
        ({"dependencies": [{"kind": "afterok", "jobs": ["p"]},
                           {"kind": "afternotok", "jobs": ["p"]}], "any_dependency": True},
         [ref("p", "FAILED")], None),
        ({"dependencies": [{"kind": "singleton"}]}, [ref("s", "RUNNING", name="n")],
         Reason.WaitingForDependency),
        ({"dependencies": [{"kind": "singleton"}]}, [ref("s", "RUNNING", name="m")], None),
        ({"array": {"id": "a", "index": 3, "count": 6, "limit": 2}},
         [ref("a0", "RUNNING", array="a"), ref("a1", "PREPARING", array="a")],
         Reason.JobArrayTaskLimit),
        ({"array": {"id": "a", "index": 3, "count": 6, "limit": 2}},
         [ref("a0", "RUNNING", array="a"), ref("a1", "QUEUED", array="a")], None),
    ],
    ids=["begin-later", "begin-passed", "afterok-running", "afterok-ok", "afterok-failed",
         "afterok-unknown", "afternotok-cancelled", "afternotok-succeeded", "afterany-waiting",
         "afterany-ended", "after-not-started", "after-started", "any-of", "singleton-waits",
         "singleton-other-name", "array-full", "array-room"],
)
def test_hold(sched: dict[str, Any], others: list[JobRef], reason: Reason | None) -> None:
    by_id = {o.id: o for o in others}
    active = [o for o in others if o.state not in ("SUCCEEDED", "FAILED", "CANCELLED")]
    got = hold(held(**sched), by_id, active, NOW)
    assert (got.reason if got else None) == reason
    if got is not None:
        assert got.never == (reason is Reason.DependencyNeverSatisfied)
        assert got.message


def test_one_cycle_never_admits_past_an_array_limit() -> None:
    tasks = [held(f"t{i}", array={"id": "a", "index": i, "count": 6, "limit": 2})
             for i in range(6)]
    got = holds_for(list(reversed(tasks)), {}, [], NOW)
    assert sorted(got) == ["t2", "t3", "t4", "t5"]
    assert {h.reason for h in got.values()} == {Reason.JobArrayTaskLimit}
    one_running = [ref("t0", "RUNNING", array="a")]
    assert sorted(holds_for(tasks[1:], {}, one_running, NOW)) == ["t2", "t3", "t4", "t5"]


def _of(team: str, r: JobRef) -> JobRef:
    return JobRef(r.id, r.state, r.name, r.user, r.created_at, r.array_id, team)


def test_another_teams_job_reads_as_no_job_and_its_state_is_never_told() -> None:
    """Team A's dependency on team B's job: the same answer as an unknown id (no oracle),
    without B's state, and it never lets A's job run (afternotok on B's failure included)."""
    mine = Held("a1", "n", "alice", NOW, Scheduling.model_validate(deps("afternotok", "b1")),
                "vision")
    theirs = _of("language", ref("b1", "FAILED"))
    got = hold(mine, {"b1": theirs}, [theirs], NOW)
    unknown = hold(mine, {}, [], NOW)
    assert got is not None and unknown is not None
    assert got == unknown and got.reason is Reason.DependencyNeverSatisfied
    assert "FAILED" not in got.message


def test_another_teams_jobs_hold_back_no_singleton_and_no_array() -> None:
    sched = {"array": {"id": "7", "index": 0, "count": 4, "limit": 2},
             "dependencies": [{"kind": "singleton", "jobs": []}]}
    mine = Held("a1", "n", "alice", NOW, Scheduling.model_validate(sched), "vision")
    spoofs = [JobRef(f"b{i}", "RUNNING", "n", "alice", T0, "7", "language") for i in range(3)]
    assert hold(mine, {}, spoofs, NOW) is None
    own = [JobRef(f"v{i}", "RUNNING", "x", "bob", T0, "7", "vision") for i in range(2)]
    got = hold(mine, {}, spoofs + own, NOW)
    assert got is not None and got.reason is Reason.JobArrayTaskLimit


def test_a_missing_approval_holds_before_anything_else() -> None:
    later = {"begin_at": (NOW + timedelta(hours=1)).isoformat()}
    job = Held("a1", "n", "alice", NOW, Scheduling.model_validate(later), "vision", "urgent")
    got = hold(job, {}, [], NOW)
    assert got is not None and got.reason is Reason.AwaitingApproval and not got.never
    assert "'urgent'" in got.message and "isthmus admin approve a1" in got.message
    approved = Held("a1", "n", "alice", NOW, Scheduling(), "vision", None)
    assert hold(approved, {}, [], NOW) is None
