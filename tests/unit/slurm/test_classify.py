"""Slurm states and reasons -> Isthmus phase, reason and failure category (table-driven)."""

from __future__ import annotations

import pytest

from backends.slurm.classify import (
    ClassifyPolicy,
    Evidence,
    NodeCondition,
    PendingCategory,
    classify,
    pending_category,
)
from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory as F
from broker.domain.reasons import Reason as R

CASES = [
    # id, evidence, phase, reason, failure
    ("pending-resources", Evidence("PENDING", "Resources"), Phase.PENDING, R.BackendPending, None),
    ("pending-priority", Evidence("PENDING", "Priority"), Phase.PENDING, R.BackendPending, None),
    ("pending-not-evaluated", Evidence("PENDING", "None"), Phase.PENDING, R.BackendPending, None),
    ("pending-qos-gres", Evidence("PENDING", "QOSGrpGRES"), Phase.PENDING, R.QuotaExhausted, None),
    ("pending-assoc-gres-min", Evidence("PENDING", "AssocGrpGRESMinutes"), Phase.PENDING,
     R.QuotaExhausted, None),
    ("pending-max-per-user", Evidence("PENDING", "QOSMaxGRESPerUser"), Phase.PENDING,
     R.QuotaExhausted, None),
    ("pending-partition-down", Evidence("PENDING", "PartitionDown"), Phase.PENDING,
     R.PoolDrained, None),
    ("pending-time-limit", Evidence("PENDING", "PartitionTimeLimit"), Phase.PENDING,
     R.DispatchRefused, None),
    ("pending-held", Evidence("PENDING", "JobHeldUser"), Phase.PENDING, R.BackendPending, None),
    ("pending-unknown-reason", Evidence("PENDING", "SomethingNew"), Phase.PENDING,
     R.BackendPending, None),
    ("configuring", Evidence("CONFIGURING"), Phase.STARTING, R.WaitingForAllRanks, None),
    ("running", Evidence("RUNNING", nodes_allocated=2, nodes_requested=2), Phase.RUNNING,
     R.Running, None),
    ("running-partial", Evidence("RUNNING", nodes_allocated=1, nodes_requested=2),
     Phase.STARTING, R.WaitingForAllRanks, None),
    ("completing", Evidence("COMPLETING", exit_code=0), Phase.RUNNING, R.Running, None),
    ("completed", Evidence("COMPLETED", exit_code=0), Phase.SUCCEEDED, R.Succeeded, None),
    ("completed-contradiction", Evidence("COMPLETED", exit_code=3), Phase.UNKNOWN, R.Unknown,
     F.UNKNOWN),
    ("failed-exit-3", Evidence("FAILED", "NonZeroExitCode", exit_code=3), Phase.FAILED,
     R.UserError, F.USER_ERROR),
    ("failed-nonzero-no-code", Evidence("FAILED", "NonZeroExitCode"), Phase.FAILED, R.UserError,
     F.USER_ERROR),
    ("failed-launch", Evidence("FAILED", "JobLaunchFailure", signal=9), Phase.FAILED,
     R.ResourceEnv, F.RESOURCE_ENV),
    ("failed-no-evidence", Evidence("FAILED", "None", exit_code=0), Phase.FAILED, R.Unknown,
     F.UNKNOWN),
    ("failed-signal-only", Evidence("FAILED", "None", signal=11), Phase.FAILED, R.Unknown,
     F.UNKNOWN),
    ("node-fail", Evidence("NODE_FAIL"), Phase.FAILED, R.InfraTransient, F.INFRA_TRANSIENT),
    ("boot-fail", Evidence("BOOT_FAIL"), Phase.FAILED, R.InfraTransient, F.INFRA_TRANSIENT),
    ("timeout", Evidence("TIMEOUT"), Phase.FAILED, R.UserError, F.USER_ERROR),
    ("oom-default", Evidence("OUT_OF_MEMORY"), Phase.FAILED, R.UserError, F.USER_ERROR),
    ("preempted", Evidence("PREEMPTED"), Phase.PREEMPTED, R.Preempted, F.INFRA_TRANSIENT),
    ("cancelled-by-us", Evidence("CANCELLED", cancelled_by="isthmus", own_user="isthmus"),
     Phase.CANCELLED, R.CancelledByUser, None),
    ("cancelled-by-admin", Evidence("CANCELLED", cancelled_by="root", own_user="isthmus"),
     Phase.CANCELLED, R.CancelledByAdmin, None),
    ("cancelled-unknown-who", Evidence("CANCELLED"), Phase.CANCELLED, R.CancelledByUser, None),
    ("unknown-state", Evidence("WEIRD_NEW_STATE"), Phase.UNKNOWN, R.Unknown, None),
]


@pytest.mark.parametrize(("evidence", "phase", "reason", "failure"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify_table(evidence: Evidence, phase: Phase, reason: R, failure: F | None) -> None:
    got = classify(evidence)
    assert (got.phase, got.reason, got.failure) == (phase, reason, failure), got.message
    assert got.message


def test_oom_is_resource_env_by_policy() -> None:
    got = classify(Evidence("OUT_OF_MEMORY"), ClassifyPolicy(oom_is_user_error=False))
    assert (got.phase, got.failure) == (Phase.FAILED, F.RESOURCE_ENV)


def test_cancelled_by_someone_else_records_who() -> None:
    got = classify(Evidence("CANCELLED", cancelled_by="alice", own_user="isthmus"))
    assert got.actor == "alice" and "alice" in got.message


def test_exit_code_is_in_the_message() -> None:
    assert "exit code 3" in classify(Evidence("FAILED", exit_code=3)).message


@pytest.mark.parametrize(("reason", "category"), [
    ("Resources", PendingCategory.RESOURCES),
    ("Priority", PendingCategory.PRIORITY),
    ("QOSGrpGRES", PendingCategory.QUOTA),
    ("AssocMaxJobsLimit", PendingCategory.QUOTA),
    ("ReqNodeNotAvail, UnavailableNodes:a100-1", PendingCategory.NODES_UNAVAILABLE),
    ("BeginTime", PendingCategory.HELD),
    ("Dependency", PendingCategory.DEPENDENCY),
    ("Brand_New_Reason", PendingCategory.UNKNOWN),
])
def test_pending_categories(reason: str, category: PendingCategory) -> None:
    assert pending_category(reason) is category


# -- node health: a FAILED job on a node that failed is the node's fault ---------------------

GANG = ("a100-1", "a100-2")
HEALTHY = NodeCondition("allocated")
SITE = ClassifyPolicy(infra_drain_reasons=("gpu-burn:",))


def ended(state: str, *, exit_code: int | None = 13, signal: int | None = None,
          reason: str = "NonZeroExitCode",
          **conditions: NodeCondition | tuple[NodeCondition, ...]) -> Evidence:
    """Evidence of a 2-node gang on GANG; keyword names are nodes with '_' for '-', each with
    one observation or several (current state first, then recorded events)."""
    nodes: dict[str, tuple[NodeCondition, ...]] = {n: (HEALTHY,) for n in GANG}
    for key, value in conditions.items():
        nodes[key.replace("_", "-")] = value if isinstance(value, tuple) else (value,)
    return Evidence(state, reason, exit_code=exit_code, signal=signal, nodes=GANG,
                    nodes_allocated=2, nodes_requested=2, node_conditions=nodes)


def down(reason: str = "isthmus-test", *flags: str) -> NodeCondition:
    return NodeCondition("down", frozenset(flags), reason)


def drained(reason: str, state: str = "allocated") -> NodeCondition:
    return NodeCondition(state, frozenset({"DRAIN"}), reason)


def recorded(state: str, reason: str, *flags: str) -> NodeCondition:
    """A state change accounting recorded while the job ran (sacctmgr show event)."""
    return NodeCondition(state, frozenset(flags), reason, at="recorded 2026-11-29T14:00:37Z")


IDLE_AGAIN = NodeCondition("idle")


INFRA = (Phase.FAILED, R.InfraTransient, F.INFRA_TRANSIENT)
USER = (Phase.FAILED, R.UserError, F.USER_ERROR)
NODE_CASES = [
    # id, evidence, policy, (phase, reason, failure), blamed nodes
    ("failed-13-node-down", ended("FAILED", a100_2=down()), None, INFRA, ("a100-2",)),
    ("failed-13-healthy-nodes", ended("FAILED"), None, USER, ()),
    ("failed-1-batch-host-lost", ended("FAILED", exit_code=1,
                                       a100_1=down("Not responding", "NOT_RESPONDING")),
     None, INFRA, ("a100-1",)),
    ("failed-not-responding-yet", ended("FAILED", a100_2=NodeCondition(
        "allocated", frozenset({"NOT_RESPONDING"}))), None, INFRA, ("a100-2",)),
    ("failed-signal-node-down", ended("FAILED", exit_code=0, signal=9, reason="None",
                                      a100_2=down()), None, INFRA, ("a100-2",)),
    ("failed-both-nodes-down", ended("FAILED", a100_1=down(), a100_2=down()), None, INFRA,
     GANG),
    ("failed-node-failing", ended("FAILED", a100_2=NodeCondition(
        "allocated", frozenset({"FAIL"}), "bad DIMM")), None, INFRA, ("a100-2",)),
    ("failed-node-error-state", ended("FAILED", a100_2=NodeCondition("error")), None, INFRA,
     ("a100-2",)),
    ("failed-launch-node-down", ended("FAILED", exit_code=0, signal=9,
                                      reason="JobLaunchFailure", a100_1=down()),
     None, INFRA, ("a100-1",)),
    ("failed-no-exit-node-down", ended("FAILED", exit_code=0, reason="None", a100_1=down()),
     None, INFRA, ("a100-1",)),
    # Slurm drained the node because it misbehaved: the node's fault
    ("failed-drained-kill-task-failed", ended("FAILED", a100_2=drained("Kill task failed")),
     None, INFRA, ("a100-2",)),
    ("failed-drained-gres-lost", ended("FAILED", a100_2=drained(
        "gres/gpu count reported lower than configured (7 < 8)")), None, INFRA, ("a100-2",)),
    ("failed-drained-by-nhc", ended("FAILED", a100_2=drained(
        "NHC: check_hw_gpu: GPU 3 missing")), None, INFRA, ("a100-2",)),
    ("failed-drained-site-checker", ended("FAILED", a100_2=drained("gpu-burn: xid 79")),
     SITE, INFRA, ("a100-2",)),
    ("failed-drained-site-checker-unconfigured",
     ended("FAILED", a100_2=drained("gpu-burn: xid 79")), None, USER, ()),
    # An admin's drain lets running jobs finish; it does not explain a non-zero exit. Had the
    # admin taken the node away, it would be DOWN (or the job CANCELLED / NODE_FAIL).
    ("failed-drained-for-maintenance", ended("FAILED", a100_2=drained("kernel upgrade")),
     None, USER, ()),
    ("failed-draining-for-maintenance", ended("FAILED", a100_2=NodeCondition(
        "draining", frozenset(), "maint window 02:00")), None, USER, ()),
    ("failed-admin-drain-and-down", ended("FAILED", a100_1=drained("kernel upgrade"),
                                          a100_2=down()), None, INFRA, ("a100-2",)),
    # a sick node outside the allocation, or no listing at all, is no evidence
    ("failed-other-node-down", ended("FAILED", a100_3=down()), None, USER, ()),
    ("failed-no-node-listing", Evidence("FAILED", "NonZeroExitCode", exit_code=13,
                                        nodes=GANG), None, USER, ()),
    ("failed-unrelated-flags", ended("FAILED", a100_2=NodeCondition(
        "mixed", frozenset({"MAINTENANCE", "REBOOT_REQUESTED"}), "Reboot ASAP")),
     None, USER, ()),
    # back in service before the end was observed (ReturnToService=2): the event still counts
    ("failed-node-down-and-back", ended("FAILED", a100_1=(IDLE_AGAIN, recorded(
        "down", "isthmus-test"))), None, INFRA, ("a100-1",)),
    ("failed-node-not-responding-and-back", ended("FAILED", exit_code=1, a100_1=(
        IDLE_AGAIN, recorded("down", "Not responding", "NOT_RESPONDING"))), None, INFRA,
     ("a100-1",)),
    ("failed-node-admin-drained-and-back", ended("FAILED", a100_2=(
        IDLE_AGAIN, recorded("drain", "kernel upgrade"))), None, USER, ()),
    ("failed-admin-drain-then-down", ended("FAILED", a100_2=(
        drained("kernel upgrade"), recorded("down", "Not responding", "NOT_RESPONDING"))),
     None, INFRA, ("a100-2",)),
    # the node's state changes nothing for ends that are not FAILED
    ("timeout-node-down", ended("TIMEOUT", exit_code=0, a100_2=down()), None, USER, ()),
    ("oom-node-down", ended("OUT_OF_MEMORY", exit_code=0, a100_2=down()), None, USER, ()),
    ("cancelled-node-down", ended("CANCELLED", exit_code=0, a100_2=down()), None,
     (Phase.CANCELLED, R.CancelledByUser, None), ()),
    ("completed-node-down-later", ended("COMPLETED", exit_code=0, a100_2=down()), None,
     (Phase.SUCCEEDED, R.Succeeded, None), ()),
    # NODE_FAIL was infra already; now it also names the node
    ("node-fail-names-node", ended("NODE_FAIL", exit_code=1, reason="NodeDown",
                                   a100_2=down()), None, INFRA, ("a100-2",)),
    ("node-fail-no-listing", Evidence("NODE_FAIL", exit_code=1), None, INFRA, ()),
    ("node-fail-names-node-back-in-service", ended("NODE_FAIL", exit_code=1, reason="NodeDown",
                                                   a100_1=(IDLE_AGAIN, recorded(
                                                       "down", "isthmus-test"))),
     None, INFRA, ("a100-1",)),
]


@pytest.mark.parametrize(("evidence", "policy", "expected", "blamed"),
                         [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES])
def test_classify_with_node_health(evidence: Evidence, policy: ClassifyPolicy | None,
                                   expected: tuple[Phase, R, F | None],
                                   blamed: tuple[str, ...]) -> None:
    got = classify(evidence, policy)
    assert (got.phase, got.reason, got.failure) == expected, got.message
    assert got.bad_nodes == blamed, got.message
    for node in blamed:
        assert node in got.message


def test_node_failure_message_keeps_exit_and_slurm_reason_of_node() -> None:
    got = classify(ended("FAILED", a100_2=down("isthmus-test", "NOT_RESPONDING")))
    assert "exit code 13" in got.message
    assert "a100-2 down+not_responding (isthmus-test)" in got.message
    assert "a100-1" not in got.message  # the healthy node is not blamed


def test_admin_drain_is_noted_but_not_blamed() -> None:
    got = classify(ended("FAILED", a100_2=drained("kernel upgrade")))
    assert got.failure is F.USER_ERROR and "exit code 13" in got.message
    assert "a100-2" in got.message and "kernel upgrade" in got.message


def test_recorded_event_is_described_with_its_time() -> None:
    got = classify(ended("NODE_FAIL", exit_code=1, a100_1=(IDLE_AGAIN, recorded(
        "down", "isthmus-test"))))
    assert "a100-1 down (isthmus-test; recorded 2026-11-29T14:00:37Z)" in got.message
