"""The adapter hands node health to the classifier: one node listing and one query of recorded
node events per observe cycle, only when a job newly ended FAILED / NODE_FAIL / BOOT_FAIL, and
the verdict stays that of the moment the end was first seen."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from backends.slurm.adapter import END_EVIDENCE_WAIT, NODE_EVENT_SLACK
from backends.slurm.classify import event_in_run
from backends.slurm.records import NodeEvent
from broker.domain.facts import Fact, Phase
from broker.domain.failures import FailureCategory as F
from tests.harness.slurm_fakes import (
    ENDED,
    GANG,
    NOW,
    STARTED,
    Clock,
    FakeTransport,
    event,
    job,
    make,
    node,
)


def only(facts: list[Fact], name: str) -> Fact:
    found = [f for f in facts if f.backend_name == name]
    assert len(found) == 1, facts
    return found[0]


def test_failed_on_a_down_node_is_infra_and_names_it() -> None:
    t = FakeTransport(queue=[job("7", "RUNNING")],
                      node_list=[node("a100-1"), node("a100-2"), node("a100-3")])
    be = make(t)
    running = only(be.observe(), "isthmus-j7-1")
    assert running.phase is Phase.RUNNING and t.node_calls == 0  # nothing ended: no listing

    t.queue = [job("7", "FAILED", exit_code=13)]
    t.node_list = [node("a100-1"), node("a100-2", "down", reason="isthmus-test"),
                   node("a100-3")]
    fact = only(be.observe(), "isthmus-j7-1")
    assert (fact.phase, fact.failure, fact.exit_code) == (Phase.FAILED, F.INFRA_TRANSIENT, 13)
    assert "a100-2 down (isthmus-test)" in fact.message and "a100-1" not in fact.message
    assert fact.bad_nodes == ("a100-2",)  # the retry avoids this node, not the whole gang's
    assert fact.nodes == GANG and t.node_calls == 1

    # the admin resumes the node; the job, still in the queue, keeps its verdict (no flip)
    t.node_list = [node("a100-1", "idle"), node("a100-2", "idle"), node("a100-3", "idle")]
    again = only(be.observe(), "isthmus-j7-1")
    assert again.failure is F.INFRA_TRANSIENT and t.node_calls == 1


def test_failed_on_healthy_nodes_stays_user_error() -> None:
    t = FakeTransport(queue=[job("8", "FAILED", exit_code=13)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")])
    fact = only(make(t).observe(), "isthmus-j8-1")
    assert fact.failure is F.USER_ERROR and "exit code 13" in fact.message
    assert t.node_calls == 1


def test_one_listing_for_all_jobs_ending_in_a_cycle_and_none_for_other_ends() -> None:
    t = FakeTransport(
        queue=[job("1", "FAILED", exit_code=1), job("2", "NODE_FAIL", exit_code=1),
               job("3", "COMPLETED", exit_code=0), job("4", "TIMEOUT", exit_code=0),
               job("5", "CANCELLED", exit_code=0)],
        node_list=[node("a100-1", "down", "NOT_RESPONDING", reason="Not responding"),
                   node("a100-2")],
    )
    facts = {f.backend_name: f for f in make(t).observe()}
    assert t.node_calls == 1
    assert facts["isthmus-j1-1"].failure is F.INFRA_TRANSIENT
    assert "a100-1 down+not_responding (Not responding)" in facts["isthmus-j2-1"].message
    assert facts["isthmus-j4-1"].failure is F.USER_ERROR

    t2 = FakeTransport(queue=[job("3", "COMPLETED", exit_code=0),
                              job("4", "TIMEOUT", exit_code=0)])
    make(t2).observe()
    assert t2.node_calls == 0 and t2.event_calls == []


def test_job_seen_only_in_accounting_is_judged_too() -> None:
    gone = replace(job("9", "FAILED", exit_code=13), source="accounting")
    t = FakeTransport(accounted=[gone],
                      node_list=[node("a100-1", "idle", "DRAIN", reason="Kill task failed"),
                                 node("a100-2", "idle")])
    be = make(t)
    fact = only(be.observe(["isthmus-j9-1"]), "isthmus-j9-1")
    assert fact.failure is F.INFRA_TRANSIENT and "Kill task failed" in fact.message


def test_site_drain_reason_from_settings() -> None:
    t = FakeTransport(queue=[job("10", "FAILED", exit_code=13)],
                      node_list=[node("a100-1", "mixed", "DRAIN", reason="gpu-burn: xid 79"),
                                 node("a100-2")])
    assert only(make(t).observe(), "isthmus-j10-1").failure is F.USER_ERROR
    site = make(FakeTransport(queue=t.queue, node_list=t.node_list),
                infra_drain_reasons=("gpu-burn:",))
    assert only(site.observe(), "isthmus-j10-1").failure is F.INFRA_TRANSIENT


def test_remembered_node_conditions_are_dropped_once_the_job_is_out_of_view() -> None:
    failed = job("11", "FAILED", exit_code=13)
    t = FakeTransport(queue=[failed], node_list=[node("a100-1", "down"), node("a100-2")])
    be = make(t)
    be.observe()
    be.observe()
    assert t.node_calls == 1  # remembered while in view
    t.queue = []
    be.observe([])  # gone from the queue and the broker no longer asks: forgotten
    t.queue = [failed]
    be.observe()
    assert t.node_calls == 2


def test_node_back_in_service_before_the_end_was_seen_is_still_blamed() -> None:
    """ReturnToService=2: a node set DOWN whose slurmd answers is idle again within a second;
    only accounting remembers that it was down."""
    t = FakeTransport(queue=[job("12", "NODE_FAIL", exit_code=1)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")],
                      events=[event("a100-1", "down", "isthmus-test", ENDED),
                              event("a100-2", "down", "long ago", STARTED - timedelta(days=1))])
    fact = only(make(t).observe(), "isthmus-j12-1")
    assert fact.failure is F.INFRA_TRANSIENT
    assert "a100-1 down (isthmus-test; recorded " in fact.message, fact.message
    assert "a100-2" not in fact.message  # its event ended before the job started
    assert t.event_calls == [(GANG, STARTED)] and t.node_calls == 1


def test_events_long_after_the_end_do_not_count() -> None:
    late = ENDED + timedelta(hours=2)
    t = FakeTransport(queue=[job("13", "FAILED", exit_code=13)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")],
                      events=[event("a100-1", "down", "unrelated", late)])
    assert only(make(t).observe(), "isthmus-j13-1").failure is F.USER_ERROR


def test_current_state_says_nothing_about_an_end_long_ago() -> None:
    """After a broker outage, a node that is down now may have gone down hours after the job
    failed; only recorded events from the job's time count then."""
    long_ago = NOW - timedelta(hours=3)
    t = FakeTransport(accounted=[job("14", "FAILED", exit_code=13, ended_at=long_ago)],
                      node_list=[node("a100-1", "down", reason="fan failure"), node("a100-2")])
    fact = only(make(t).observe(["isthmus-j14-1"]), "isthmus-j14-1")
    assert fact.failure is F.USER_ERROR, fact.message


def test_one_event_query_for_all_jobs_ending_in_a_cycle() -> None:
    t = FakeTransport(queue=[job("15", "FAILED", exit_code=1, nodes=("a100-1",)),
                             job("16", "FAILED", exit_code=1, nodes=("a100-3",))],
                      node_list=[node("a100-1"), node("a100-3")])
    make(t).observe()
    assert t.event_calls == [(("a100-1", "a100-3"), STARTED)] and t.node_calls == 1


def test_failed_before_any_rank_started_is_orchestration_not_the_users() -> None:
    healthy = [node("a100-1", "idle"), node("a100-2", "idle")]
    t = FakeTransport(queue=[job("20", "FAILED", exit_code=1), job("21", "FAILED", exit_code=1),
                             job("22", "FAILED", exit_code=1)],
                      node_list=healthy,
                      step_map={"20": ("batch", "extern"), "21": ("batch", "extern", "0")})
    facts = make(t).observe()
    never = only(facts, "isthmus-j20-1")
    assert (never.phase, never.failure) == (Phase.FAILED, F.ORCHESTRATION)
    assert "before any rank started" in never.message
    assert only(facts, "isthmus-j21-1").failure is F.USER_ERROR  # its code ran and failed
    assert only(facts, "isthmus-j22-1").failure is F.USER_ERROR
    assert t.step_calls == [("20", "21", "22")]  # one query for the cycle


def test_end_not_yet_in_accounting_waits_then_the_exit_code_decides() -> None:
    """Steps (and node events) are known only once accounting has the end: until then the job
    is still ending; if accounting never catches up, the exit code decides after the wait."""
    clock = Clock(NOW)
    t = FakeTransport(queue=[job("22", "FAILED", exit_code=1)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")],
                      unrecorded={"22"})
    be = make(t, clock=clock)
    ending = only(be.observe(), "isthmus-j22-1")
    assert (ending.phase, ending.failure, ending.raw_state) == (Phase.RUNNING, None, "FAILED")
    assert "waiting for accounting" in ending.message
    clock.now = NOW + END_EVIDENCE_WAIT
    fact = only(be.observe(), "isthmus-j22-1")
    assert (fact.phase, fact.failure) == (Phase.FAILED, F.USER_ERROR)  # steps unknown
    assert len(t.step_calls) == 2
    only(be.observe(), "isthmus-j22-1")
    assert len(t.step_calls) == 2  # judged: not asked again


def test_caches_forget_jobs_nobody_asks_about_any_more() -> None:
    t = FakeTransport(queue=[job("30", "RUNNING"), job("31", "RUNNING")])
    be = make(t)
    be.observe(["isthmus-j30-1", "isthmus-j31-1"])
    assert set(be._known_ids) == {"isthmus-j30-1", "isthmus-j31-1"}
    t.queue = []  # both left the queue; the broker only asks about one of them now
    t.accounted = [job("30", "COMPLETED", exit_code=0)]
    be.observe(["isthmus-j30-1"])
    assert set(be._known_ids) == {"isthmus-j30-1"} and set(be._last_seen) == {"isthmus-j30-1"}
    be.observe([])
    assert not be._known_ids and not be._last_seen


# -- which recorded events count: the job's own run, never an earlier job's story ----------

S, E = STARTED, ENDED  # the job's run
SEC = timedelta(seconds=1)


@pytest.mark.parametrize(("case", "start", "end", "counts"), [
    ("stale: over long before the job", S - timedelta(hours=1), S - timedelta(minutes=59), False),
    ("stale: back in service just before the start", S - 4 * SEC, S - SEC, False),
    ("stale: back in the very second the job got it", S - 3 * SEC, S, False),
    ("stale: open, began before the start (end not recorded yet)", S - 5 * SEC, None, False),
    ("concurrent: began and ended during the run", S + 60 * SEC, S + 62 * SEC, True),
    ("concurrent: down and back within one second", E, E, True),
    ("concurrent: began in the second the job started", S, S, True),
    ("concurrent: began before, recorded end after the start", S - 5 * SEC, S + 3 * SEC, True),
    ("open: began during the run, still going on", E - SEC, None, True),
    ("after: stamped a few seconds after the end", E + 5 * SEC, E + 5 * SEC, True),
    ("after: the next job's event, half a minute after the end", E + 33 * SEC, None, False),
    ("after: long after the end", E + timedelta(hours=2), None, False),
    ("no start recorded", None, None, False),
])
def test_event_in_run(case: str, start: datetime | None, end: datetime | None,
                      counts: bool) -> None:
    assert event_in_run(start, end, S, E, NODE_EVENT_SLACK) is counts, case


def test_only_the_node_whose_event_overlaps_the_run_is_blamed() -> None:
    """The gang's nodes all went down before the job (an earlier test, another tenant's job),
    and a100-2 again half a minute after it (judged late, after a broker restart); during the
    run only a100-1 did. Every node is back in service when the end is seen."""
    t = FakeTransport(
        queue=[job("40", "NODE_FAIL", exit_code=0)],
        node_list=[node("a100-1", "idle"), node("a100-2", "idle")],
        events=[event("a100-1", "fail", "stale", S - 3 * SEC, end=S),
                event("a100-2", "fail", "stale", S - 3 * SEC, end=S),
                event("a100-2", "down", "earlier run", S - timedelta(minutes=5), "NOT_RESPONDING",
                      end=S - timedelta(minutes=4)),
                open_event("a100-2", "down", "end not recorded", S - 2 * SEC),
                event("a100-2", "down", "next test", E + 33 * SEC, "NOT_RESPONDING",
                      end=E + 36 * SEC),
                event("a100-1", "down", "isthmus-test", E)])
    fact = only(make(t).observe(), "isthmus-j40-1")
    assert (fact.phase, fact.failure) == (Phase.FAILED, F.INFRA_TRANSIENT)
    assert fact.bad_nodes == ("a100-1",), fact.message
    assert "a100-1 down (isthmus-test; recorded " in fact.message
    assert "a100-2" not in fact.message and "stale" not in fact.message
    assert "next test" not in fact.message


def test_node_fail_waits_for_the_failed_nodes_event() -> None:
    """slurmdbd records the event of a node set DOWN after the job's NODE_FAIL end (and seconds
    late on a busy machine), while the node is already back: the verdict waits for it."""
    clock = Clock(NOW)
    t = FakeTransport(queue=[job("41", "NODE_FAIL", exit_code=0)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")])
    be = make(t, clock=clock)
    assert only(be.observe(), "isthmus-j41-1").phase is Phase.RUNNING  # still ending
    t.events = [event("a100-1", "down", "isthmus-test", E)]
    clock.now = NOW + 2 * SEC
    fact = only(be.observe(), "isthmus-j41-1")
    assert fact.failure is F.INFRA_TRANSIENT and fact.bad_nodes == ("a100-1",), fact.message
    assert len(t.event_calls) == 2


def test_node_fail_without_any_event_is_judged_after_the_wait() -> None:
    clock = Clock(NOW)
    t = FakeTransport(queue=[job("42", "NODE_FAIL", exit_code=0)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")])
    be = make(t, clock=clock)
    assert only(be.observe(), "isthmus-j42-1").phase is Phase.RUNNING
    clock.now = NOW + END_EVIDENCE_WAIT
    fact = only(be.observe(), "isthmus-j42-1")
    assert (fact.phase, fact.failure, fact.bad_nodes) == (Phase.FAILED, F.INFRA_TRANSIENT, ())


def test_node_fail_over_a_transport_without_node_events_does_not_wait() -> None:
    t = FakeTransport(kind="rest", queue=[job("43", "NODE_FAIL", exit_code=0)],
                      node_list=[node("a100-1", "idle"), node("a100-2", "idle")])
    t.serves_node_events = False
    fact = only(make(t).observe(), "isthmus-j43-1")
    assert (fact.phase, fact.failure) == (Phase.FAILED, F.INFRA_TRANSIENT)


def open_event(name: str, state: str, reason: str, start: datetime) -> NodeEvent:
    return NodeEvent(node=name, state=state, reason=reason, start=start, end=None)
