"""Classification of Kubernetes Job/Pod evidence: table-driven, one row per kind of evidence."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from backends.k8s.classify import judge, parse_teardown, teardown_annotation
from backends.k8s.pod_evidence import ClassifyPolicy, terminated_category, waiting_verdict
from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory as C
from broker.domain.reasons import Reason
from tests.harness.k8s_requests import cond, job, pod

NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
POLICY = ClassifyPolicy(image_pull_timeout_s=60, all_ranks_timeout_s=5)


def oom(**kw: Any) -> dict[str, Any]:
    return pod(0, "Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}, **kw)


def exit_pod(index: int, code: int, **kw: Any) -> dict[str, Any]:
    return pod(index, "Failed", terminated={"exitCode": code, "reason": "Error"}, **kw)


def disrupted(reason: str) -> dict[str, Any]:
    return pod(0, "Failed", terminated={"exitCode": 143, "reason": "Error"},
               conditions=[cond("DisruptionTarget", reason, "by the system")])


FAILED = [cond("Failed", "PodFailurePolicy", "matching FailJob rule")]

# (id, job, pods, expected phase, reason, failure category, teardown)
CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], Phase, Reason, C | None, bool]] = [
    ("complete", job(conditions=[cond("Complete")]),
     [pod(0, "Succeeded", terminated={"exitCode": 0, "reason": "Completed"})],
     Phase.SUCCEEDED, Reason.Succeeded, None, False),
    ("all-ranks-succeeded-before-condition", job(),
     [pod(i, "Succeeded", terminated={"exitCode": 0}) for i in range(2)],
     Phase.SUCCEEDED, Reason.Succeeded, None, False),
    ("oom-is-user-error", job(conditions=FAILED), [oom(), pod(1, deleting=True)],
     Phase.FAILED, Reason.UserError, C.USER_ERROR, False),
    ("oom-seen-before-job-condition", job(), [oom(), pod(1)],
     Phase.FAILED, Reason.UserError, C.USER_ERROR, False),
    ("non-zero-exit", job(conditions=FAILED), [exit_pod(0, 3)],
     Phase.FAILED, Reason.UserError, C.USER_ERROR, False),
    ("root-cause-not-the-killed-rank", job(conditions=FAILED),
     [exit_pod(0, 143, deleting=True), exit_pod(1, 42)],
     Phase.FAILED, Reason.UserError, C.USER_ERROR, False),
    ("deadline-exceeded-is-max-runtime",
     job(conditions=[cond("Failed", "DeadlineExceeded", "Job was active longer than specified")]),
     [pod(0, deleting=True)], Phase.FAILED, Reason.UserError, C.USER_ERROR, False),
    ("preemption-by-scheduler", job(conditions=FAILED), [disrupted("PreemptionByScheduler")],
     Phase.PREEMPTED, Reason.Preempted, C.INFRA_TRANSIENT, False),
    ("eviction-api", job(conditions=FAILED), [disrupted("EvictionByEvictionAPI")],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, False),
    ("taint-manager-node-lost", job(conditions=FAILED), [disrupted("DeletionByTaintManager")],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, False),
    ("podgc-orphan-node-deleted", job(conditions=FAILED), [disrupted("DeletionByPodGC")],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, False),
    ("kubelet-evicted", job(conditions=FAILED), [pod(0, "Failed", reason="Evicted")],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, False),
    ("node-lost-reason", job(conditions=FAILED), [pod(0, "Failed", reason="NodeLost")],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, False),
    ("unknown-disruption-stays-unknown", job(conditions=FAILED), [disrupted("SomethingNew")],
     Phase.FAILED, Reason.Unknown, C.UNKNOWN, False),
    ("failed-without-evidence", job(conditions=FAILED), [],
     Phase.FAILED, Reason.Unknown, C.UNKNOWN, False),
    ("deleted-pod-only-is-unknown", job(conditions=FAILED), [exit_pod(0, 143, deleting=True)],
     Phase.FAILED, Reason.Unknown, C.UNKNOWN, False),
    ("image-pull-backoff-early", job(),
     [pod(0, "Pending", waiting="ImagePullBackOff", scheduled_at="2026-01-01T00:00:05Z"),
      pod(1, "Pending", waiting="ImagePullBackOff", scheduled_at="2026-01-01T00:00:05Z")],
     Phase.STARTING, Reason.PullingImage, None, False),
    ("image-pull-backoff-past-threshold", job(),
     [pod(0, "Pending", waiting="ErrImagePull", scheduled_at="2025-12-31T23:00:00Z")],
     Phase.FAILED, Reason.ResourceEnv, C.RESOURCE_ENV, True),
    ("invalid-image-name-at-once", job(),
     [pod(0, "Pending", waiting="InvalidImageName")],
     Phase.FAILED, Reason.ResourceEnv, C.RESOURCE_ENV, True),
    ("all-running", job(), [pod(0), pod(1, node="n1")],
     Phase.RUNNING, Reason.Running, None, False),
    ("some-scheduled-within-timeout", job(),
     [pod(0, scheduled_at="2026-01-01T00:00:08Z"), pod(1, "Pending", node=None, scheduled_at=None)],
     Phase.STARTING, Reason.WaitingForAllRanks, None, False),
    ("all-ranks-timeout", job(),
     [pod(0, scheduled_at=T0_), pod(1, "Pending", node=None, scheduled_at=None)]
     if (T0_ := "2026-01-01T00:00:00Z") else [],
     Phase.FAILED, Reason.WaitingForAllRanks, C.ORCHESTRATION, True),
    ("nothing-scheduled", job(),
     [pod(0, "Pending", node=None, scheduled_at=None,
          conditions=[cond("PodScheduled", "Unschedulable", "0/16 nodes are available",
                           status="False")])],
     Phase.PENDING, Reason.BackendPending, None, False),
    ("no-pods-yet", job(), [], Phase.PENDING, Reason.BackendPending, None, False),
    ("suspended-for-kueue", job(suspend=True), [], Phase.PENDING, Reason.BackendPending, None,
     False),
    ("deleted-outside-isthmus", job(deleting=True), [pod(0)],
     Phase.CANCELLED, Reason.CancelledByAdmin, None, False),
    ("torn-down-all-ranks",
     job(annotations={"isthmus.io/teardown": "ORCHESTRATION/WaitingForAllRanks: 1 of 2"},
         deleting=True), [pod(0, deleting=True)],
     Phase.FAILED, Reason.WaitingForAllRanks, C.ORCHESTRATION, False),
    ("torn-down-node-lost",
     job(annotations={"isthmus.io/teardown": "INFRA_TRANSIENT/NodeLost: node n0 is gone"}), [],
     Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, True),  # annotated, not deleted
]


@pytest.mark.parametrize(("job_", "pods", "phase", "reason", "failure", "teardown"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_judge(job_: dict[str, Any], pods: list[dict[str, Any]], phase: Phase, reason: Reason,
               failure: C | None, teardown: bool) -> None:
    v = judge(job_, pods, NOW, POLICY)
    assert (v.phase, v.reason, v.failure, v.teardown) == (phase, reason, failure, teardown), v


def test_rank_on_a_lost_node_tears_the_gang_down() -> None:
    v = judge(job(), [pod(0, node="gone"), pod(1, node="n1")], NOW, POLICY,
              lost_nodes=frozenset({"gone"}))
    assert (v.phase, v.failure, v.raw_reason, v.teardown) == (
        Phase.FAILED, C.INFRA_TRANSIENT, "NodeLost", True)
    assert "gone" in v.message
    assert v.bad_nodes == ("gone",)  # only that node is avoided by the retry


def test_oom_by_policy_flag_is_resource_env() -> None:
    v = judge(job(conditions=FAILED), [oom()], NOW, ClassifyPolicy(oom_is_user_error=False))
    assert v.failure is C.RESOURCE_ENV
    assert v.exit_code == 137 and v.signal == 9


def test_facts_carry_nodes_in_rank_order_and_times() -> None:
    v = judge(job(conditions=[cond("Complete")]),
              [pod(1, "Succeeded", node="b", terminated={"exitCode": 0}),
               pod(0, "Succeeded", node="a", terminated={"exitCode": 0})], NOW, POLICY)
    assert v.nodes == ("a", "b")
    assert v.submitted_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert v.started_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert v.ended_at == datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC)


def test_pending_message_is_the_schedulers() -> None:
    p = pod(0, "Pending", node=None, scheduled_at=None,
            conditions=[cond("PodScheduled", "Unschedulable", "Insufficient nvidia.com/gpu",
                             status="False")])
    v = judge(job(), [p], NOW, POLICY)
    assert v.raw_reason == "Unschedulable" and "Insufficient" in v.message


@pytest.mark.parametrize(("reason", "code", "expected"), [
    ("Completed", 0, None),
    ("Error", 1, C.USER_ERROR),
    ("OOMKilled", 137, C.USER_ERROR),
    ("ContainerCannotRun", 128, C.RESOURCE_ENV),
    ("StartError", 128, C.RESOURCE_ENV),
    ("DeadlineExceeded", 1, C.USER_ERROR),
    ("", None, C.UNKNOWN),
])
def test_terminated_category(reason: str, code: int | None, expected: C | None) -> None:
    assert terminated_category(reason, code, ClassifyPolicy()) is expected


@pytest.mark.parametrize(("reason", "waited", "expected"), [
    ("ContainerCreating", 999, (Reason.WaitingForAllRanks, None)),
    ("ImagePullBackOff", 10, (Reason.PullingImage, None)),
    ("ErrImagePull", 61, (Reason.ResourceEnv, C.RESOURCE_ENV)),
    ("InvalidImageName", 0, (Reason.ResourceEnv, C.RESOURCE_ENV)),
    ("CreateContainerConfigError", 10, (Reason.WaitingForAllRanks, None)),
    ("CreateContainerConfigError", 61, (Reason.ResourceEnv, C.RESOURCE_ENV)),
])
def test_waiting(reason: str, waited: float, expected: tuple[Reason, C | None]) -> None:
    assert waiting_verdict(reason, waited, POLICY) == expected


def test_teardown_annotation_round_trip() -> None:
    text = teardown_annotation(C.ORCHESTRATION, "WaitingForAllRanks", "only 3 of 4: ranks")
    assert parse_teardown(text) == (C.ORCHESTRATION, "WaitingForAllRanks", "only 3 of 4: ranks")
    assert parse_teardown("garbage")[0] is C.UNKNOWN
