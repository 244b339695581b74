"""The evidence of one Kubernetes pod: why it failed, when its containers started and ended,
what a waiting container is waiting for. Pure, table-driven (classify.py judges the gang)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import FAILURE_REASON, Reason

C = FailureCategory
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True, slots=True)
class ClassifyPolicy:
    oom_is_user_error: bool = True  # a reproducible OOM; False files it under RESOURCE_ENV
    image_pull_timeout_s: float = 600.0
    all_ranks_timeout_s: float = 300.0


# container termination reasons (other than a plain non-zero exit)
TERMINATED_REASON: dict[str, FailureCategory] = {
    "ContainerCannotRun": C.RESOURCE_ENV,
    "StartError": C.RESOURCE_ENV,
    "DeadlineExceeded": C.USER_ERROR,
}
# DisruptionTarget condition reasons -> (phase, category)
DISRUPTION_REASON: dict[str, tuple[Phase, FailureCategory]] = {
    "PreemptionByScheduler": (Phase.PREEMPTED, C.INFRA_TRANSIENT),
    "EvictionByEvictionAPI": (Phase.FAILED, C.INFRA_TRANSIENT),
    "DeletionByTaintManager": (Phase.FAILED, C.INFRA_TRANSIENT),
    "DeletionByPodGC": (Phase.FAILED, C.INFRA_TRANSIENT),
    "TerminationByKubelet": (Phase.FAILED, C.INFRA_TRANSIENT),
}
# pod.status.reason of a failed pod
POD_REASON: dict[str, FailureCategory] = {
    "Evicted": C.INFRA_TRANSIENT,
    "NodeLost": C.INFRA_TRANSIENT,
    "Shutdown": C.INFRA_TRANSIENT,
    "Terminated": C.INFRA_TRANSIENT,
    "NodeShutdown": C.INFRA_TRANSIENT,
    "UnexpectedAdmissionError": C.RESOURCE_ENV,
    "DeadlineExceeded": C.USER_ERROR,
}
# container waiting reasons: (fails at once?, category once it fails)
WAITING_REASON: dict[str, tuple[bool, FailureCategory]] = {
    "ErrImagePull": (False, C.RESOURCE_ENV),
    "ImagePullBackOff": (False, C.RESOURCE_ENV),
    "InvalidImageName": (True, C.RESOURCE_ENV),
    "ErrImageNeverPull": (True, C.RESOURCE_ENV),
    "CreateContainerConfigError": (False, C.RESOURCE_ENV),
    "CreateContainerError": (False, C.RESOURCE_ENV),
}
IMAGE_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "ErrImageNeverPull"})
@dataclass(frozen=True, slots=True)
class PodFailure:
    phase: Phase
    failure: FailureCategory
    raw_reason: str
    message: str
    exit_code: int | None = None
    signal: int | None = None
    pod: str = ""
    at: datetime | None = None
    consequential: bool = False  # killed because of another failure (deleted by the Job)


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or ())


def terminated_category(reason: str, exit_code: int | None,
                        policy: ClassifyPolicy) -> FailureCategory | None:
    """A container that ended: None when it succeeded."""
    if reason == "OOMKilled":
        return C.USER_ERROR if policy.oom_is_user_error else C.RESOURCE_ENV
    if reason in TERMINATED_REASON:
        return TERMINATED_REASON[reason]
    if exit_code == 0:
        return None
    if exit_code is not None:
        return C.USER_ERROR
    return C.UNKNOWN


def waiting_verdict(reason: str, waited_s: float,
                    policy: ClassifyPolicy) -> tuple[Reason, FailureCategory | None]:
    """A container not started yet: a progress reason, or a failure once it is hopeless."""
    entry = WAITING_REASON.get(reason)
    if entry is None:
        return Reason.WaitingForAllRanks, None
    at_once, category = entry
    progress = Reason.PullingImage if reason in IMAGE_WAITING else Reason.WaitingForAllRanks
    if at_once or waited_s >= policy.image_pull_timeout_s:
        return FAILURE_REASON[category], category
    return progress, None


def pod_failure(pod: Mapping[str, Any], policy: ClassifyPolicy) -> PodFailure | None:
    """Why a pod failed, or None when it did not (yet)."""
    status = pod.get("status") or {}
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    deleted = bool(meta.get("deletionTimestamp"))
    disruption = condition(pod, "DisruptionTarget")
    if disruption is not None:
        phase, category = DISRUPTION_REASON.get(
            str(disruption.get("reason", "")), (Phase.FAILED, C.UNKNOWN)
        )
        if status.get("phase") == "Failed" or deleted:
            return PodFailure(phase, category, str(disruption.get("reason", "DisruptionTarget")),
                              str(disruption.get("message", "")), pod=name,
                              at=parse_time(disruption.get("lastTransitionTime")))
    if status.get("phase") != "Failed":
        return None
    pod_reason = str(status.get("reason") or "")
    if pod_reason in POD_REASON:
        return PodFailure(Phase.FAILED, POD_REASON[pod_reason], pod_reason,
                          str(status.get("message", "")), pod=name, at=finished_at(pod))
    for cs in containers(pod):
        term = (cs.get("state") or {}).get("terminated")
        if not term:
            continue
        code = term.get("exitCode")
        reason = str(term.get("reason") or "")
        ended_as = terminated_category(reason, code, policy)
        if ended_as is None:
            continue
        signal = code - 128 if isinstance(code, int) and code > 128 else None
        msg = str(term.get("message") or "")
        if deleted and reason != "OOMKilled":
            # stopped because its pod was deleted: by the Job after another rank failed, or
            # by someone else; either way not evidence about this rank's code
            return PodFailure(Phase.FAILED, C.UNKNOWN, reason or "PodDeleted",
                              msg or "the pod was deleted while running", code, signal,
                              name, parse_time(term.get("finishedAt")), consequential=True)
        return PodFailure(Phase.FAILED, ended_as, reason or "Error", msg, code, signal, name,
                          parse_time(term.get("finishedAt")))
    return PodFailure(Phase.FAILED, C.UNKNOWN, pod_reason or "Failed",
                      str(status.get("message", "")), pod=name, at=finished_at(pod),
                      consequential=deleted)


def finished_at(pod: Mapping[str, Any]) -> datetime | None:
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for cs in containers(pod)]
    known = [e for e in ends if e is not None]
    return max(known) if known else None


def started_at(pod: Mapping[str, Any]) -> datetime | None:
    starts = []
    for cs in containers(pod):
        state = cs.get("state") or {}
        began = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        if began:
            starts.append(parse_time(began))
    known = [s for s in starts if s is not None]
    return max(known) if known else None


def root_cause(failures: Iterable[PodFailure]) -> PodFailure | None:
    """The failure that ended the gang: evidence first, then the earliest."""
    far = datetime.max.replace(tzinfo=None)

    def key(f: PodFailure) -> tuple[bool, bool, datetime]:
        at = f.at.replace(tzinfo=None) if f.at else far
        return (f.consequential, f.failure is C.UNKNOWN, at)

    ranked = sorted(failures, key=key)
    return ranked[0] if ranked else None


def rank_index(pod: Mapping[str, Any]) -> int:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return int(ann.get(COMPLETION_INDEX, 1 << 30))
    except ValueError:
        return 1 << 30


