"""Kueue's Workload conditions -> the verdict on a Job of a pool in kueue mode."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from backends.k8s.adapter import K8sBackend
from backends.k8s.classify import judge, teardown_annotation
from backends.k8s.client import ApiError
from backends.k8s.kueue import (
    EVICTED_BY_KUEUE,
    JOB_UID_LABEL,
    MAX_TEXT,
    QUEUE_LABEL,
    by_job_uid,
    queue_of,
    refine,
)
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory as C
from broker.domain.reasons import Reason
from tests.harness.k8s_requests import T0, T9, cond, job, pod

NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
NO_QUOTA = ("couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor a100-80g, 8 more needed")


def kjob(**kw: Any) -> dict[str, Any]:
    j = job(**kw)
    j["metadata"]["labels"] = {QUEUE_LABEL: "isthmus"}
    return j


def workload(*conditions: dict[str, Any], admission: dict[str, Any] | None = None,
             owner: str = "u-1") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission:
        status["admission"] = admission
    return {"metadata": {"name": "job-x-1", "namespace": "ns",
                         "ownerReferences": [{"kind": "Job", "uid": owner}]},
            "status": status}


ADMISSION = {"clusterQueue": "vision",
             "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100-80g"}}]}


def verdict(j: dict[str, Any], wl: dict[str, Any] | None,
            pods: list[dict[str, Any]] | None = None) -> Any:
    return refine(j, wl, judge(j, pods or [], NOW), NOW)


def test_held_for_lack_of_quota_quotes_the_condition() -> None:
    wl = workload(cond("QuotaReserved", "Pending", NO_QUOTA, status="False"))
    v = verdict(kjob(suspend=True), wl)
    assert (v.phase, v.reason, v.raw_reason) == (Phase.PENDING, Reason.HeldByKueue, "Pending")
    assert v.message == f"Kueue (LocalQueue isthmus): QuotaReserved=False (Pending): {NO_QUOTA}"


def test_no_workload_yet_and_not_evaluated_yet() -> None:
    v = verdict(kjob(suspend=True), None)
    assert (v.phase, v.reason, v.raw_reason) == (Phase.PENDING, Reason.HeldByKueue, "NoWorkload")
    v = verdict(kjob(suspend=True), workload())
    assert (v.reason, v.raw_reason) == (Reason.HeldByKueue, "NotEvaluated")


def test_quota_reserved_waits_for_admission_checks() -> None:
    wl = workload(cond("QuotaReserved", "QuotaReserved"),
                  cond("Admitted", "NoChecks", "waiting for admission checks", status="False"),
                  admission=ADMISSION)
    v = verdict(kjob(suspend=True), wl)
    assert (v.phase, v.reason) == (Phase.PENDING, Reason.HeldByKueue)
    assert "ClusterQueue vision, flavor a100-80g" in v.message
    assert "Admitted=False (NoChecks): waiting for admission checks" in v.message


def test_admitted_but_still_suspended_is_backend_pending() -> None:
    wl = workload(cond("QuotaReserved"), cond("Admitted", "Admitted"), admission=ADMISSION)
    v = verdict(kjob(suspend=True), wl)
    assert (v.phase, v.reason) == (Phase.PENDING, Reason.BackendPending)
    assert v.message.startswith("admitted by Kueue (ClusterQueue vision, flavor a100-80g)")


def test_admitted_and_running_keeps_the_pods_verdict() -> None:
    wl = workload(cond("QuotaReserved"), cond("Admitted", "Admitted"), admission=ADMISSION)
    v = verdict(kjob(), wl, [pod(0), pod(1)])
    assert (v.phase, v.reason) == (Phase.RUNNING, Reason.Running)


def test_evicted_by_preemption_is_preempted_and_torn_down() -> None:
    wl = workload(cond("Admitted", at=T0),
                  cond("Evicted", "Preempted", "Preempted to accommodate a workload", at=T9),
                  cond("Preempted", "InClusterQueue", "Preempted to accommodate a workload "
                       "(UID: x) due to prioritization in the ClusterQueue", at=T9))
    v = verdict(kjob(), wl, [pod(0), pod(1)])
    assert (v.phase, v.reason, v.failure) == (Phase.PREEMPTED, Reason.Preempted,
                                              C.INFRA_TRANSIENT)
    assert v.teardown and v.raw_reason == EVICTED_BY_KUEUE
    assert v.message.startswith("evicted by Kueue: Preempted=True (InClusterQueue): ")
    # the Job's own end wins over a later Workload condition
    done = kjob(conditions=[cond("Complete")])
    assert verdict(done, wl).phase is Phase.SUCCEEDED


def test_evicted_then_readmitted_is_not_preempted() -> None:
    wl = workload(cond("Evicted", "Preempted", "x", at=T0), cond("Admitted", at=T9))
    v = verdict(kjob(), wl, [pod(0), pod(1)])
    assert v.phase is Phase.RUNNING


def test_our_teardown_after_an_eviction_stays_preempted() -> None:
    note = teardown_annotation(C.INFRA_TRANSIENT, EVICTED_BY_KUEUE, "evicted by Kueue: ...")
    j = kjob(annotations={"isthmus.io/teardown": note}, deleting=True)
    v = verdict(j, None)
    assert (v.phase, v.reason, v.teardown) == (Phase.PREEMPTED, Reason.Preempted, False)


def test_kueue_text_is_bounded() -> None:
    wl = workload(cond("QuotaReserved", "Pending", "x" * 5000, status="False"))
    v = verdict(kjob(suspend=True), wl)
    assert len(v.message) < MAX_TEXT + 100


def test_index_and_queue() -> None:
    by_label = {"metadata": {"labels": {JOB_UID_LABEL: "u-2"}}}
    assert set(by_job_uid([workload(owner="u-1"), by_label])) == {"u-1", "u-2"}
    assert queue_of(kjob()) == "isthmus" and queue_of(job()) is None


def test_kueue_not_installed_is_no_workload_not_an_outage() -> None:
    """Workloads answering 404 (no Kueue CRDs): the Jobs say no Workload was made for them;
    any other error still propagates."""
    settings = K8sSettings.from_dict({"modes": {"a100": "kueue"}, "kueue_queues": {"a100": "q"}})
    backend = K8sBackend("k8s", [K8sPoolBinding("a100", "a100-80g", {"isthmus.io/pool": "a100"})],
                         settings, watch=False)
    assert backend.uses_kueue

    def missing(kind: str) -> list[dict[str, Any]]:
        raise ApiError(404, "the server could not find the requested resource")

    backend._objects = missing  # type: ignore[method-assign]
    assert backend._workloads() == {}

    def forbidden(kind: str) -> list[dict[str, Any]]:
        raise ApiError(403, "forbidden")

    backend._objects = forbidden  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        backend._workloads()
