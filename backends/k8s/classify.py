"""Kubernetes Job/Pod evidence -> Isthmus Phase / Reason / FailureCategory. Pure, table-driven.

Input is the API's JSON (dicts) of one Job and its pods, the time of observation and a few
site knobs; output is a `Verdict` the adapter turns into a Fact. Nothing here guesses: a reason
or exit that is not in the tables, or a pod that vanished without evidence, yields UNKNOWN with
the raw values kept in the message.

Order of checks for a Job (first match wins):
1. an Isthmus teardown annotation (all-ranks timeout, node lost, image never pulled): FAILED
   with the category recorded in it;
2. the Job's Complete / Failed (or SuccessCriteriaMet / FailureTarget) condition;
3. a failed pod (the earliest one that was not killed as a consequence of another failure);
4. the Job being deleted by someone else: CANCELLED;
5. suspended (Kueue has not admitted it): PENDING;
6. per-pod progress: image problems, ranks on lost nodes, every rank running, some ranks
   scheduled (with the all-ranks timeout), nothing scheduled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.domain.facts import Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import FAILURE_REASON, Reason

C = FailureCategory
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TEARDOWN_ANNOTATION = "isthmus.io/teardown"
WAITING_FOR_ALL_RANKS = "WaitingForAllRanks"
NODE_LOST = "NodeLost"


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
# Job Failed condition reasons whose cause is the Job itself, not one of its pods
JOB_FAILED_REASON: dict[str, FailureCategory] = {
    "DeadlineExceeded": C.USER_ERROR,  # activeDeadlineSeconds = max_runtime
}


@dataclass(frozen=True, slots=True)
class Verdict:
    phase: Phase
    reason: Reason = Reason.Unknown
    failure: FailureCategory | None = None
    raw_state: str = ""
    raw_reason: str = ""
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: tuple[str, ...] = ()
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    teardown: bool = False  # the adapter must stop the gang (and record this verdict)
    bad_nodes: tuple[str, ...] = ()  # nodes blamed for an infrastructure failure


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


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
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
                          str(status.get("message", "")), pod=name, at=_finished(pod))
    for cs in _containers(pod):
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
                      str(status.get("message", "")), pod=name, at=_finished(pod),
                      consequential=deleted)


def _finished(pod: Mapping[str, Any]) -> datetime | None:
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for cs in _containers(pod)]
    known = [e for e in ends if e is not None]
    return max(known) if known else None


def _started(pod: Mapping[str, Any]) -> datetime | None:
    starts = []
    for cs in _containers(pod):
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


def _index(pod: Mapping[str, Any]) -> int:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return int(ann.get(COMPLETION_INDEX, 1 << 30))
    except ValueError:
        return 1 << 30


def parse_teardown(value: str) -> tuple[FailureCategory, str, str]:
    """'<CATEGORY>/<raw reason>: message' as written by `teardown_annotation`."""
    head, _, message = value.partition(": ")
    cat, _, raw = head.partition("/")
    try:
        category = FailureCategory(cat)
    except ValueError:
        category = C.UNKNOWN
    return category, raw, message


def teardown_annotation(category: FailureCategory, raw_reason: str, message: str) -> str:
    return f"{category.value}/{raw_reason}: {message}"


def _seconds(now: datetime, then: datetime | None) -> float:
    if then is None:
        return 0.0
    return (now - then).total_seconds()


def judge(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: datetime,
    policy: ClassifyPolicy | None = None,
    lost_nodes: frozenset[str] = frozenset(),
) -> Verdict:
    """The verdict on one gang; see the module docstring for the order of checks."""
    policy = policy or ClassifyPolicy()
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    replicas = int(spec.get("parallelism") or spec.get("completions") or 1)
    pods = sorted(pods, key=_index)
    nodes = tuple(dict.fromkeys(
        str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")
    ))
    submitted = parse_time(meta.get("creationTimestamp"))
    starts = [_started(p) for p in pods]
    started = (max(s for s in starts if s is not None)
               if len(pods) >= replicas and all(s is not None for s in starts) else None)
    base: dict[str, Any] = {"nodes": nodes, "submitted_at": submitted, "started_at": started}

    # 1. an Isthmus teardown
    teardown = (meta.get("annotations") or {}).get(TEARDOWN_ANNOTATION)
    if teardown:
        category, raw, message = parse_teardown(str(teardown))
        reason = Reason.WaitingForAllRanks if raw == WAITING_FOR_ALL_RANKS else \
            FAILURE_REASON[category]
        # still there and not being deleted: the deletion after the annotation failed
        return Verdict(Phase.FAILED, reason, category, "TornDown", raw, message,
                       ended_at=parse_time(meta.get("deletionTimestamp")) or now,
                       teardown=not meta.get("deletionTimestamp"), **base)

    # 2. the Job's own end
    done = condition(job, "Complete") or condition(job, "SuccessCriteriaMet")
    if done is not None:
        ended = parse_time((job.get("status") or {}).get("completionTime")) or parse_time(
            done.get("lastTransitionTime"))
        return Verdict(Phase.SUCCEEDED, Reason.Succeeded, None, "Complete",
                       str(done.get("reason") or ""), "every rank exited 0",
                       exit_code=0, ended_at=ended, **base)
    failed = condition(job, "Failed") or condition(job, "FailureTarget")
    cause = root_cause(f for p in pods if (f := pod_failure(p, policy)) is not None)
    if failed is not None:
        job_reason = str(failed.get("reason") or "")
        ended = parse_time(failed.get("lastTransitionTime"))
        if job_reason in JOB_FAILED_REASON:
            category = JOB_FAILED_REASON[job_reason]
            msg = str(failed.get("message") or "") or "the Job ran past its max_runtime"
            return Verdict(Phase.FAILED, FAILURE_REASON[category], category, "Failed",
                           job_reason, msg, ended_at=ended, **base)
        if cause is not None:
            return _from_pod(cause, "Failed", ended, base)
        return Verdict(Phase.FAILED, Reason.Unknown, C.UNKNOWN, "Failed", job_reason,
                       str(failed.get("message") or ""), ended_at=ended, **base)

    # 3. a failed pod before the Job condition says so
    if cause is not None and not cause.consequential:
        return _from_pod(cause, "PodFailed", cause.at, base)

    # 4. deleted by someone else (Isthmus annotates before it deletes)
    if meta.get("deletionTimestamp"):
        return Verdict(Phase.CANCELLED, Reason.CancelledByAdmin, None, "Deleting", "Deleted",
                       "the Job was deleted outside Isthmus",
                       ended_at=parse_time(meta.get("deletionTimestamp")), **base)

    # 5. not admitted
    if spec.get("suspend"):
        return Verdict(Phase.PENDING, Reason.BackendPending, None, "Suspended", "Suspended",
                       "the Job is suspended (waiting for Kueue admission)", **base)

    return _progress(pods, replicas, now, policy, lost_nodes, base)


def _from_pod(cause: PodFailure, raw_state: str, ended: datetime | None,
              base: dict[str, Any]) -> Verdict:
    reason = Reason.Preempted if cause.phase is Phase.PREEMPTED else FAILURE_REASON[cause.failure]
    where = f"{cause.pod}: " if cause.pod else ""
    return Verdict(cause.phase, reason, cause.failure, raw_state, cause.raw_reason,
                   f"{where}{cause.message or cause.raw_reason}", cause.exit_code, cause.signal,
                   ended_at=ended or cause.at, **base)


def _progress(pods: Sequence[Mapping[str, Any]], replicas: int, now: datetime,
              policy: ClassifyPolicy, lost_nodes: frozenset[str],
              base: dict[str, Any]) -> Verdict:
    live = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")
            and not (p.get("metadata") or {}).get("deletionTimestamp")]
    done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
    # ranks on nodes that no longer exist
    for p in live:
        node = (p.get("spec") or {}).get("nodeName")
        if node and node in lost_nodes:
            name = (p.get("metadata") or {}).get("name", "")
            return Verdict(Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, "Running",
                           NODE_LOST, f"{name}: node {node} is gone", teardown=True,
                           ended_at=now, bad_nodes=(str(node),), **base)
    # images and container creation
    pulling: list[str] = []
    for p in live:
        scheduled = condition(p, "PodScheduled")
        waited = _seconds(now, parse_time(scheduled.get("lastTransitionTime"))
                          if scheduled else None)
        for cs in _containers(p):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            wreason = str(waiting.get("reason") or "")
            if not wreason:
                continue
            reason, failure = waiting_verdict(wreason, waited, policy)
            name = (p.get("metadata") or {}).get("name", "")
            if failure is not None:
                msg = str(waiting.get("message") or "")
                return Verdict(Phase.FAILED, reason, failure, "Pending", wreason,
                               f"{name}: {wreason} {msg}".strip(), teardown=True,
                               ended_at=now, **base)
            if reason is Reason.PullingImage:
                pulling.append(f"{name}: {wreason}")
    running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) + len(done) >= replicas and running:
        return Verdict(Phase.RUNNING, Reason.Running, None, "Running", "",
                       f"{len(running)} of {replicas} ranks running", **base)
    if len(done) >= replicas:
        ends = [e for p in done if (e := _finished(p)) is not None]
        return Verdict(Phase.SUCCEEDED, Reason.Succeeded, None, "Succeeded", "",
                       "every rank exited 0", exit_code=0, ended_at=max(ends, default=now),
                       **base)
    bound = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if bound or done:
        times = [parse_time(c.get("lastTransitionTime")) for p in bound
                 if (c := condition(p, "PodScheduled")) is not None]
        first = min((t for t in times if t is not None), default=None)
        waited = _seconds(now, first)
        # capacity taken by someone else: some ranks can not even be placed (slow image
        # pulls of placed ranks are the image-pull timeout's business)
        short = len(bound) + len(done) < replicas
        if short and first is not None and waited >= policy.all_ranks_timeout_s:
            return Verdict(Phase.FAILED, Reason.WaitingForAllRanks, C.ORCHESTRATION, "Starting",
                           WAITING_FOR_ALL_RANKS,
                           f"only {len(running)} of {replicas} ranks running "
                           f"{waited:.0f}s after the first was scheduled (timeout "
                           f"{policy.all_ranks_timeout_s:.0f}s); the gang was torn down",
                           teardown=True, ended_at=now, **base)
        reason = Reason.PullingImage if pulling else Reason.WaitingForAllRanks
        detail = "; ".join(pulling) if pulling else f"{len(bound)} of {replicas} ranks scheduled"
        return Verdict(Phase.STARTING, reason, None, "Starting", reason.value,
                       f"{len(running)} of {replicas} ranks running ({detail})", **base)
    message = _unschedulable(live) or "no rank scheduled yet"
    return Verdict(Phase.PENDING, Reason.BackendPending, None, "Pending",
                   "Unschedulable" if _unschedulable(live) else "", message, **base)


def _unschedulable(pods: Sequence[Mapping[str, Any]]) -> str:
    for p in pods:
        for cond in (p.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message") or cond.get("reason") or "")
    return ""
