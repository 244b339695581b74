"""set_state on a real database: the full transition table, rules and hooks, idempotency."""

from __future__ import annotations

import pytest
from sqlalchemy import event as sa_event

from broker.domain import JobState, Reason, is_allowed
from broker.orchestration import (
    Cause,
    Outcome,
    Rule,
    RuleSet,
    Ruling,
    TransitionContext,
    set_state,
)
from broker.orchestration.replay import replay
from broker.orchestration.transitions import JobNotFound
from broker.store import Database, cause_lookups
from broker.store.queries import get_job, job_events
from tests.builders import insert_job_in_state

S = JobState
PAIRS = [(a, b) for a in S for b in S]
CAUSE = Cause("test", "tester")
RESERVATION = {"reservation": {"flavor": "h100-80g", "gpus": 16}}
ADMIT = Cause("admission", "tester", details=RESERVATION)


def _reason_for(dst: JobState) -> Reason:
    return {S.CANCELLED: Reason.CancelledByUser, S.RETRYING: Reason.RetryScheduled}.get(
        dst, Reason.BackendPending
    )


def test_every_allowed_and_forbidden_transition(db: Database) -> None:
    """All 121 (from, to) pairs through set_state, on this database."""
    with db.write() as s:
        for src, dst in PAIRS:
            job_id = insert_job_in_state(s, src, Reason.Submitted)
            retry = src in (S.FAILED, S.RETRYING)  # their ways on are the retry engine's
            cause = Cause("retry" if retry else "test", "tester", details=RESERVATION)
            result = set_state(s, job_id, dst, _reason_for(dst), cause)
            job = get_job(s, job_id)
            assert job is not None
            if is_allowed(src, dst):
                assert result.outcome is Outcome.ACCEPT, (src, dst, result)
                assert job.state == dst and job.reason == _reason_for(dst)
                assert result.event is not None and result.event.from_state == src
            else:
                assert result.outcome is Outcome.REJECT, (src, dst)
                assert result.reason is Reason.TransitionNotAllowed
                assert job.state == src
                assert len(job_events(s, job_id)) == 1  # nothing appended


def test_failed_job_is_retried_only_by_the_retry_engine(db: Database) -> None:
    with db.write() as s:
        job_id = insert_job_in_state(s, S.FAILED, Reason.UserError)
        refused = set_state(s, job_id, S.RETRYING, Reason.RetryScheduled, Cause("api", "user"))
        assert refused.outcome is Outcome.REJECT and refused.reason is Reason.RetryNotDecided
        ok = set_state(s, job_id, S.RETRYING, Reason.RetryScheduled, Cause("retry", "engine"))
        assert ok.outcome is Outcome.ACCEPT


def test_same_cause_twice_changes_nothing(db: Database) -> None:
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
    cause = Cause("reconciler", "system", key="fact:42")
    for expected in (Outcome.ACCEPT, Outcome.NOOP, Outcome.NOOP):
        with db.write() as s:
            r = set_state(s, job_id, S.CANCELLED, Reason.CancelledByUser, cause)
            assert r.outcome is expected
    with db.read() as s:
        assert [e.to_state for e in job_events(s, job_id)] == ["SUBMITTED", "CANCELLED"]


def test_a_cause_read_ahead_is_still_applied_once(db: Database) -> None:
    """Inside cause_lookups.read_ahead (a reconcile chunk, a dispatch record) a cause applied
    before is still a NOOP, one not applied is ACCEPTed without asking the database, and one
    applied in the block is a NOOP when proposed again."""
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
    old, new = Cause("test", "tester", key="old"), Cause("test", "tester", key="new")
    with db.write() as s:
        set_state(s, job_id, S.QUEUED, Reason.QuotaExhausted, old)
    with db.write() as s, cause_lookups.read_ahead(s, [(job_id, "old"), (job_id, "new")]):
        assert cause_lookups.known_new(s, job_id, "new")
        assert not cause_lookups.known_new(s, job_id, "old")
        again = set_state(s, job_id, S.CANCELLED, Reason.CancelledByUser, old)
        first = set_state(s, job_id, S.QUEUED, Reason.InsufficientCapacity, new)
        assert not cause_lookups.known_new(s, job_id, "new")  # its event is written now
        repeated = set_state(s, job_id, S.CANCELLED, Reason.CancelledByUser, new)
    assert (again.outcome, first.outcome, repeated.outcome) == (
        Outcome.NOOP, Outcome.ACCEPT, Outcome.NOOP)
    with db.read() as s:
        assert [e.reason for e in job_events(s, job_id)][-2:] == [
            "QuotaExhausted", "InsufficientCapacity"]


def test_same_state_and_reason_is_a_noop_but_a_new_reason_is_an_event(db: Database) -> None:
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
        s.flush()
        first = set_state(s, job_id, S.QUEUED, Reason.QuotaExhausted, CAUSE, "team quota used")
        again = set_state(s, job_id, S.QUEUED, Reason.QuotaExhausted, CAUSE, "team quota used")
        other = set_state(s, job_id, S.QUEUED, Reason.InsufficientCapacity, CAUSE)
        assert (first.outcome, again.outcome, other.outcome) == (
            Outcome.ACCEPT, Outcome.NOOP, Outcome.ACCEPT,
        )


def test_admission_counts_attempts(db: Database) -> None:
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
        for dst, reason in [
            (S.ADMITTED, Reason.Admitted), (S.QUEUED, Reason.DispatchRefused),
            (S.ADMITTED, Reason.Admitted), (S.PREPARING, Reason.BackendPending),
        ]:
            assert set_state(s, job_id, dst, reason, ADMIT).accepted
        job = get_job(s, job_id)
        assert job is not None and job.attempt == 2
        assert job_events(s, job_id)[-1].attempt == 2


class Recorder(Rule):
    """Reserves in before, releases in cleanup, records after: the shape of a quota rule."""

    to_states = frozenset({S.ADMITTED})

    def __init__(self, log: list[str], refuse: Ruling | None = None) -> None:
        self.log, self.refuse = log, refuse

    def before(self, ctx: TransitionContext) -> Ruling | None:
        self.log.append(f"reserve:{ctx.job.id}")
        return self.refuse

    def cleanup(self, ctx: TransitionContext) -> None:
        self.log.append("release")

    def after(self, ctx: TransitionContext) -> None:
        self.log.append(f"after:{ctx.job.state}")


@pytest.mark.parametrize("outcome", [Outcome.REJECT, Outcome.WAIT, Outcome.ABORT])
def test_refusal_runs_cleanup_of_earlier_rules_and_writes_nothing(
    db: Database, outcome: Outcome
) -> None:
    log: list[str] = []
    refusing = Recorder([], Ruling(outcome, Reason.QuotaExhausted, "no quota", retry_after=5.0))
    rules = RuleSet([Recorder(log), refusing])
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
        r = set_state(s, job_id, S.ADMITTED, Reason.Admitted, CAUSE, rules=rules)
        assert r.outcome is outcome and r.reason is Reason.QuotaExhausted
        assert r.retry_after == 5.0
        assert log == [f"reserve:{job_id}", "release"]
        job = get_job(s, job_id)
        assert job is not None and job.state == S.QUEUED and job.attempt == 0


def test_after_hooks_see_the_new_state(db: Database) -> None:
    log: list[str] = []
    rules = RuleSet([Recorder(log)])
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
        assert set_state(s, job_id, S.ADMITTED, Reason.Admitted, ADMIT, rules=rules).accepted
    assert log == [f"reserve:{job_id}", "after:ADMITTED"]


def test_unknown_job(db: Database) -> None:
    with db.write() as s, pytest.raises(JobNotFound):
        set_state(s, "0000000000000000", S.CANCELLED, Reason.CancelledByUser, CAUSE)


def test_events_are_append_only_in_the_database(db: Database) -> None:
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
    for stmt in ("UPDATE job_events SET reason = 'X'", "DELETE FROM job_events"):
        with pytest.raises(Exception, match="append-only"), db.write() as s:
            s.connection().exec_driver_sql(stmt)
    with db.read() as s:
        rep = replay(job_events(s, job_id))
        assert rep.state == S.SUBMITTED and rep.problems == ()


def test_fresh_causes_are_not_asked_for_yet_applied_once(db: Database) -> None:
    """cause_lookups.fresh (a reconcile chunk's keys name the facts it just inserted) answers
    "none" without a statement; a fresh cause proposed twice in the block is still applied
    once (its first event is learnt), and the block does not nest with a read-ahead."""
    with db.write() as s:
        job_id = insert_job_in_state(s, S.QUEUED, Reason.WaitingForAdmission)
    new = Cause("test", "tester", key="fact:7:0")
    asked: list[str] = []
    with db.write() as s:
        sa_event.listen(s.connection(), "before_cursor_execute",
                        lambda *a: asked.append(a[2]) if "job_events" in a[2]
                        and a[2].lstrip().upper().startswith("SELECT") else None)
        with cause_lookups.fresh(s, [(job_id, "fact:7:0")]):
            assert cause_lookups.known_new(s, job_id, "fact:7:0")
            first = set_state(s, job_id, S.QUEUED, Reason.InsufficientCapacity, new)
            assert asked == []  # neither read ahead nor looked up
            repeated = set_state(s, job_id, S.CANCELLED, Reason.CancelledByUser, new)
            with pytest.raises(RuntimeError, match="does not nest"), \
                    cause_lookups.read_ahead(s, []):
                pass
    assert (first.outcome, repeated.outcome) == (Outcome.ACCEPT, Outcome.NOOP)
