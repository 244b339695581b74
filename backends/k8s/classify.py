"""Kubernetes Job/Pod evidence -> Isthmus Phase / Reason / FailureCategory. Pure, table-driven.

Input is the API's JSON (dicts) of one Job and its pods, the time of observation and a few
site knobs; output is a `Finding` (broker.domain.facts) the adapter turns into a Fact. The
evidence of single pods is read by pod_evidence.py. Nothing here guesses: a reason or exit that
is not in the tables, or a pod that vanished without evidence, yields UNKNOWN with the raw
values kept in the message.

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

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from backends.k8s.pod_evidence import (
    ClassifyPolicy,
    PodFailure,
    condition,
    containers,
    finished_at,
    parse_time,
    pod_failure,
    rank_index,
    root_cause,
    started_at,
    waiting_verdict,
)
from broker.domain.facts import Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import FAILURE_REASON, Reason

C = FailureCategory
TEARDOWN_ANNOTATION = "isthmus.io/teardown"
WAITING_FOR_ALL_RANKS = "WaitingForAllRanks"
NODE_LOST = "NodeLost"
JSON = Mapping[str, Any]

# Job Failed condition reasons whose cause is the Job itself, not one of its pods
JOB_FAILED_REASON: dict[str, FailureCategory] = {
    "DeadlineExceeded": C.USER_ERROR,  # activeDeadlineSeconds = max_runtime
}


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
    job: JSON,
    pods: Sequence[JSON],
    now: datetime,
    policy: ClassifyPolicy | None = None,
    lost_nodes: frozenset[str] = frozenset(),
) -> Finding:
    """The finding on one gang; see the module docstring for the order of checks."""
    policy = policy or ClassifyPolicy()
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    replicas = int(spec.get("parallelism") or spec.get("completions") or 1)
    pods = sorted(pods, key=rank_index)
    base = _common(meta, pods, replicas)
    found = _torn_down(meta, now, base) or _completed(job, base)  # 1, 2
    if found is not None:
        return found
    cause = root_cause(f for p in pods if (f := pod_failure(p, policy)) is not None)
    found = _job_failed(job, cause, base)  # 2
    if found is not None:
        return found
    if cause is not None and not cause.consequential:  # 3. before the Job condition says so
        return _from_pod(cause, "PodFailed", cause.at, base)
    if meta.get("deletionTimestamp"):  # 4. deleted by someone else (Isthmus annotates first)
        return Finding(Phase.CANCELLED, Reason.CancelledByAdmin, None, "Deleting", "Deleted",
                       "the Job was deleted outside Isthmus",
                       ended_at=parse_time(meta.get("deletionTimestamp")), **base)
    if spec.get("suspend"):  # 5. not admitted
        return Finding(Phase.PENDING, Reason.BackendPending, None, "Suspended", "Suspended",
                       "the Job is suspended (waiting for Kueue admission)", **base)
    return _progress(pods, replicas, now, policy, lost_nodes, base)


def _common(meta: JSON, pods: Sequence[JSON], replicas: int) -> dict[str, Any]:
    """What every finding on the gang carries: its nodes, when it was submitted and when its
    last rank started (once every rank has)."""
    nodes = tuple(dict.fromkeys(
        str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")
    ))
    starts = [started_at(p) for p in pods]
    started = (max(s for s in starts if s is not None)
               if len(pods) >= replicas and all(s is not None for s in starts) else None)
    return {"nodes": nodes, "submitted_at": parse_time(meta.get("creationTimestamp")),
            "started_at": started}


def _torn_down(meta: JSON, now: datetime, base: dict[str, Any]) -> Finding | None:
    """1. An Isthmus teardown: the verdict recorded in the annotation."""
    teardown = (meta.get("annotations") or {}).get(TEARDOWN_ANNOTATION)
    if not teardown:
        return None
    category, raw, message = parse_teardown(str(teardown))
    reason = Reason.WaitingForAllRanks if raw == WAITING_FOR_ALL_RANKS else \
        FAILURE_REASON[category]
    # still there and not being deleted: the deletion after the annotation failed
    return Finding(Phase.FAILED, reason, category, "TornDown", raw, message,
                   ended_at=parse_time(meta.get("deletionTimestamp")) or now,
                   teardown=not meta.get("deletionTimestamp"), **base)


def _completed(job: JSON, base: dict[str, Any]) -> Finding | None:
    """2. The Job's Complete (or SuccessCriteriaMet) condition."""
    done = condition(job, "Complete") or condition(job, "SuccessCriteriaMet")
    if done is None:
        return None
    ended = parse_time((job.get("status") or {}).get("completionTime")) or parse_time(
        done.get("lastTransitionTime"))
    return Finding(Phase.SUCCEEDED, Reason.Succeeded, None, "Complete",
                   str(done.get("reason") or ""), "every rank exited 0",
                   exit_code=0, ended_at=ended, **base)


def _job_failed(job: JSON, cause: PodFailure | None, base: dict[str, Any]) -> Finding | None:
    """2. The Job's Failed (or FailureTarget) condition: its own cause, else its pods'."""
    failed = condition(job, "Failed") or condition(job, "FailureTarget")
    if failed is None:
        return None
    job_reason = str(failed.get("reason") or "")
    ended = parse_time(failed.get("lastTransitionTime"))
    if job_reason in JOB_FAILED_REASON:
        category = JOB_FAILED_REASON[job_reason]
        msg = str(failed.get("message") or "") or "the Job ran past its max_runtime"
        return Finding(Phase.FAILED, FAILURE_REASON[category], category, "Failed",
                       job_reason, msg, ended_at=ended, **base)
    if cause is not None:
        return _from_pod(cause, "Failed", ended, base)
    return Finding(Phase.FAILED, Reason.Unknown, C.UNKNOWN, "Failed", job_reason,
                   str(failed.get("message") or ""), ended_at=ended, **base)


def _from_pod(cause: PodFailure, raw_state: str, ended: datetime | None,
              base: dict[str, Any]) -> Finding:
    reason = Reason.Preempted if cause.phase is Phase.PREEMPTED else FAILURE_REASON[cause.failure]
    where = f"{cause.pod}: " if cause.pod else ""
    return Finding(cause.phase, reason, cause.failure, raw_state, cause.raw_reason,
                   f"{where}{cause.message or cause.raw_reason}", cause.exit_code, cause.signal,
                   ended_at=ended or cause.at, **base)


def _progress(pods: Sequence[JSON], replicas: int, now: datetime, policy: ClassifyPolicy,
              lost_nodes: frozenset[str], base: dict[str, Any]) -> Finding:
    """6. A gang on its way: ranks on lost nodes, image and container problems, every rank
    running, some ranks scheduled, nothing scheduled."""
    live = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")
            and not (p.get("metadata") or {}).get("deletionTimestamp")]
    done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
    found = _on_lost_node(live, lost_nodes, now, base)
    if found is not None:
        return found
    found, pulling = _waiting(live, now, policy, base)
    if found is not None:
        return found
    running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) + len(done) >= replicas and running:
        return Finding(Phase.RUNNING, Reason.Running, None, "Running", "",
                       f"{len(running)} of {replicas} ranks running", **base)
    if len(done) >= replicas:
        ends = [e for p in done if (e := finished_at(p)) is not None]
        return Finding(Phase.SUCCEEDED, Reason.Succeeded, None, "Succeeded", "",
                       "every rank exited 0", exit_code=0, ended_at=max(ends, default=now),
                       **base)
    bound = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if bound or done:
        return _starting(bound, len(done), len(running), replicas, pulling, now, policy, base)
    message = _unschedulable(live) or "no rank scheduled yet"
    return Finding(Phase.PENDING, Reason.BackendPending, None, "Pending",
                   "Unschedulable" if _unschedulable(live) else "", message, **base)


def _on_lost_node(live: Sequence[JSON], lost_nodes: frozenset[str], now: datetime,
                  base: dict[str, Any]) -> Finding | None:
    """A rank bound to a node that no longer exists: the gang is torn down."""
    for p in live:
        node = (p.get("spec") or {}).get("nodeName")
        if node and node in lost_nodes:
            name = (p.get("metadata") or {}).get("name", "")
            return Finding(Phase.FAILED, Reason.InfraTransient, C.INFRA_TRANSIENT, "Running",
                           NODE_LOST, f"{name}: node {node} is gone", teardown=True,
                           ended_at=now, bad_nodes=(str(node),), **base)
    return None


def _waiting(live: Sequence[JSON], now: datetime, policy: ClassifyPolicy,
             base: dict[str, Any]) -> tuple[Finding | None, list[str]]:
    """Images and container creation: a container that waits in vain ends the gang (a
    finding); those still pulling their image are listed ("<pod>: <reason>")."""
    pulling: list[str] = []
    for p in live:
        scheduled = condition(p, "PodScheduled")
        waited = _seconds(now, parse_time(scheduled.get("lastTransitionTime"))
                          if scheduled else None)
        for cs in containers(p):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            wreason = str(waiting.get("reason") or "")
            if not wreason:
                continue
            reason, failure = waiting_verdict(wreason, waited, policy)
            name = (p.get("metadata") or {}).get("name", "")
            if failure is not None:
                msg = str(waiting.get("message") or "")
                return Finding(Phase.FAILED, reason, failure, "Pending", wreason,
                               f"{name}: {wreason} {msg}".strip(), teardown=True,
                               ended_at=now, **base), pulling
            if reason is Reason.PullingImage:
                pulling.append(f"{name}: {wreason}")
    return None, pulling


def _starting(bound: Sequence[JSON], done: int, running: int, replicas: int,
              pulling: list[str], now: datetime, policy: ClassifyPolicy,
              base: dict[str, Any]) -> Finding:
    """Some ranks placed, not all running: starting, or torn down once the others could not
    be placed within the all-ranks timeout."""
    times = [parse_time(c.get("lastTransitionTime")) for p in bound
             if (c := condition(p, "PodScheduled")) is not None]
    first = min((t for t in times if t is not None), default=None)
    waited = _seconds(now, first)
    # capacity taken by someone else: some ranks can not even be placed (slow image
    # pulls of placed ranks are the image-pull timeout's business)
    short = len(bound) + done < replicas
    if short and first is not None and waited >= policy.all_ranks_timeout_s:
        return Finding(Phase.FAILED, Reason.WaitingForAllRanks, C.ORCHESTRATION, "Starting",
                       WAITING_FOR_ALL_RANKS,
                       f"only {running} of {replicas} ranks running "
                       f"{waited:.0f}s after the first was scheduled (timeout "
                       f"{policy.all_ranks_timeout_s:.0f}s); the gang was torn down",
                       teardown=True, ended_at=now, **base)
    reason = Reason.PullingImage if pulling else Reason.WaitingForAllRanks
    detail = "; ".join(pulling) if pulling else f"{len(bound)} of {replicas} ranks scheduled"
    return Finding(Phase.STARTING, reason, None, "Starting", reason.value,
                   f"{running} of {replicas} ranks running ({detail})", **base)


def _unschedulable(pods: Sequence[JSON]) -> str:
    for p in pods:
        for cond in (p.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message") or cond.get("reason") or "")
    return ""
