"""Slurm states and reasons -> Isthmus phase, reason and failure category (table-driven)."""

from __future__ import annotations

import pytest

from backends.slurm.classify import (
    ClassifyPolicy,
    Evidence,
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
