"""Kueue's word on a Job of a pool in ``kueue`` mode: its Workload -> the verdict. Pure.

In ``kueue`` mode the Job is created suspended with the LocalQueue label (manifests.py); Kueue
makes a Workload for it (owned by the Job, labelled with the Job's uid), reserves quota in a
ClusterQueue and admits it by unsuspending the Job, or evicts it later (preemption, a stopped
queue, ...) by suspending it again and deleting its pods. `refine` turns the Workload's
conditions into what Isthmus shows and does:

- while Kueue holds the suspended Job: PENDING with reason HeldByKueue, the message quoting
  the Workload's condition (``QuotaReserved=False (Pending): couldn't assign flavors ...``);
- admitted, Job not yet unsuspended: PENDING, BackendPending, naming the ClusterQueue and
  flavors; admitted and running: the pods' own verdict (classify.judge), unchanged;
- evicted by Kueue (Evicted=True after the last admission): PREEMPTED, and the gang is torn
  down (Isthmus owns retries: left alone, Kueue would re-admit this attempt on its own and
  two attempts of one job could run). The teardown annotation keeps the verdict while the Job
  is being deleted.

The Job's own end (Complete / Failed) always wins over the Workload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from backends.k8s.classify import TEARDOWN_ANNOTATION, parse_teardown
from backends.k8s.pod_evidence import parse_time
from broker.domain.facts import Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason

KUEUE_GROUP = "kueue.x-k8s.io"
WORKLOADS = "workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
EVICTED_BY_KUEUE = "EvictedByKueue"  # raw reason of our teardown after an eviction
MAX_TEXT = 500  # Kueue's messages are quoted up to this many characters
ENDED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


def queue_of(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue a Job was sent to, or None when Kueue is not involved."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    queue = labels.get(QUEUE_LABEL)
    return str(queue) if queue else None


def by_job_uid(workloads: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Workloads keyed by the uid of the Job that owns them."""
    out: dict[str, Mapping[str, Any]] = {}
    for wl in workloads:
        meta = wl.get("metadata") or {}
        uid = (meta.get("labels") or {}).get(JOB_UID_LABEL)
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") == "Job" and ref.get("uid"):
                uid = ref["uid"]
        if uid:
            out[str(uid)] = wl
    return out


def _cond(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of `kind` whatever its status."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def _true(cond: Mapping[str, Any] | None) -> bool:
    return cond is not None and cond.get("status") == "True"


def _text(value: Any) -> str:
    text = " ".join(str(value or "").split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def _quote(cond: Mapping[str, Any]) -> str:
    """'QuotaReserved=False (Pending): couldn't assign flavors ...'"""
    head = f"{cond.get('type')}={cond.get('status')}"
    reason = _text(cond.get("reason"))
    msg = _text(cond.get("message"))
    return f"{head}{f' ({reason})' if reason else ''}{f': {msg}' if msg else ''}"


def admission_text(workload: Mapping[str, Any]) -> str:
    """'ClusterQueue vision, flavor a100-80g' from the Workload's admission."""
    admission = (workload.get("status") or {}).get("admission") or {}
    cq = _text(admission.get("clusterQueue")) or "?"
    flavors = sorted({_text(f) for ps in admission.get("podSetAssignments") or ()
                      for f in (ps.get("flavors") or {}).values()})
    return f"ClusterQueue {cq}" + (f", flavor {', '.join(flavors)}" if flavors else "")


def _evicted(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Evicted condition when it is True and newer than the last admission."""
    evicted = _cond(workload, "Evicted")
    if not _true(evicted):
        return None
    assert evicted is not None
    admitted = _cond(workload, "Admitted")
    if _true(admitted):
        at_evict = parse_time(evicted.get("lastTransitionTime"))
        at_admit = parse_time(admitted.get("lastTransitionTime") if admitted else None)
        if at_evict and at_admit and at_admit > at_evict:
            return None  # re-admitted since
    return evicted


def refine(job: Mapping[str, Any], workload: Mapping[str, Any] | None, v: Finding,
           now: datetime) -> Finding:
    """The verdict of classify.judge on a Job sent to Kueue, refined by its Workload."""
    meta = job.get("metadata") or {}
    teardown = str((meta.get("annotations") or {}).get(TEARDOWN_ANNOTATION) or "")
    if teardown and parse_teardown(teardown)[1] == EVICTED_BY_KUEUE:
        return dataclasses.replace(v, phase=Phase.PREEMPTED, reason=Reason.Preempted)
    if v.phase in ENDED:
        return v
    if workload is not None and (evicted := _evicted(workload)) is not None:
        preempted = _cond(workload, "Preempted")
        why = _quote(preempted if preempted is not None and _true(preempted) else evicted)
        return dataclasses.replace(
            v, phase=Phase.PREEMPTED, reason=Reason.Preempted,
            failure=FailureCategory.INFRA_TRANSIENT, raw_state=EVICTED_BY_KUEUE,
            raw_reason=EVICTED_BY_KUEUE, message=f"evicted by Kueue: {why}",
            ended_at=parse_time(evicted.get("lastTransitionTime")) or now, teardown=True)
    suspended = bool((job.get("spec") or {}).get("suspend"))
    if not suspended:
        return v  # admitted and started: the pods tell the rest
    queue = queue_of(job) or "?"
    if workload is None:
        return _held(v, "NoWorkload",
                     f"Kueue has not created a Workload for the Job yet (LocalQueue {queue})")
    admitted = _cond(workload, "Admitted")
    if _true(admitted):
        return dataclasses.replace(
            v, phase=Phase.PENDING, reason=Reason.BackendPending, raw_state="Admitted",
            raw_reason="Admitted",
            message=f"admitted by Kueue ({admission_text(workload)}); the Job is starting")
    quota = _cond(workload, "QuotaReserved")
    if _true(quota):
        wait = _quote(admitted) if admitted else "Admitted not set yet"
        return _held(v, "QuotaReserved",
                     f"Kueue reserved quota ({admission_text(workload)}); waiting: {wait}")
    if quota is not None:
        return _held(v, str(quota.get("reason") or "QuotaReserved=False"),
                     f"Kueue (LocalQueue {queue}): {_quote(quota)}")
    return _held(v, "NotEvaluated", f"Kueue has not evaluated the Workload yet "
                 f"(LocalQueue {queue})")


def _held(v: Finding, raw_reason: str, message: str) -> Finding:
    return dataclasses.replace(v, phase=Phase.PENDING, reason=Reason.HeldByKueue,
                               raw_state="HeldByKueue", raw_reason=_text(raw_reason),
                               message=message)
