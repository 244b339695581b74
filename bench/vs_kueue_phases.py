"""Per-phase breakdown of one `bench.vs_kueue` run: where each gang's time goes, from the
objects' own timestamps (Jobs, pods, Kueue Workloads: 1 s resolution) and Isthmus's job events.

Per gang (the time of the *last* pod where a gang has several):

    submit -> admitted        quota reserved and placement chosen (Kueue: Workload Admitted;
                              Isthmus: ADMITTED event)
    admitted -> job started   Kueue: the Job unsuspended (Job status.startTime);
                              Isthmus: the Job created (its creationTimestamp)
    job -> pods created       the Job controller created every pod (pod creationTimestamp)
    pods -> scheduled         every pod bound (PodScheduled)
    scheduled -> running      every pod's container started (kwok's Running stage)
    running -> pods done      every container terminated (the pods' fake duration)
    pods done -> job complete the Job controller saw it (Job status.completionTime)
    complete -> released      the quota given back (Kueue: Workload Finished; Isthmus: the job's
                              SUCCEEDED event, which ends its quota charge)

and "held": admitted -> released, the time a gang holds quota, of which only "running -> pods
done" is work. `release -> next admission`: for each release, the wait until the next
admission of any gang after it (while some gang was still waiting).
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

STEPS = ("submitted", "admitted", "job", "pods", "scheduled", "running", "done", "complete",
         "released")
LABELS = ("submit -> admitted", "admitted -> job started", "job -> pods created",
          "pods -> scheduled", "scheduled -> running", "running -> pods done",
          "pods done -> job complete", "complete -> released")


@dataclass
class Phases:
    """gang -> step -> wall time (seconds since the epoch)."""

    at: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))

    def put(self, gang: int, step: str, when: float | None, latest: bool = True) -> None:
        if when is None:
            return
        old = self.at[gang].get(step)
        if old is None or (when > old if latest else when < old):
            self.at[gang][step] = when


def ts(value: Any) -> float | None:
    """An API timestamp (RFC 3339 string or datetime) as seconds since the epoch."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _cond(obj: Mapping[str, Any], kind: str) -> float | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return ts(c.get("lastTransitionTime"))
    return None


def _container(pod: Mapping[str, Any], state: str, key: str) -> float | None:
    """The latest `key` of the containers' `state` (all of them must have it)."""
    found = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        st = cs.get("state") or {}
        found.append(ts((st.get(state) or (st.get("terminated") if state == "running" else
                                            None) or {}).get(key)))
    known = [e for e in found if e is not None]
    return max(known) if known and len(known) == len(found) else None


def add_pods(phases: Phases, pods: Iterable[Mapping[str, Any]],
             gang_of: Any, replicas: Mapping[int, int]) -> None:
    """The pod steps of every gang whose pods all reached them (latest pod)."""
    seen: dict[int, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for p in pods:
        g = gang_of(p)
        if g is None:
            continue
        meta = p.get("metadata") or {}
        seen[g]["pods"].append(ts(meta.get("creationTimestamp")))
        seen[g]["scheduled"].append(_cond(p, "PodScheduled"))
        seen[g]["running"].append(_container(p, "running", "startedAt"))
        seen[g]["done"].append(_container(p, "terminated", "finishedAt"))
    for g, steps in seen.items():
        for step, values in steps.items():
            known = [v for v in values if v is not None]
            if len(known) >= replicas[g]:
                phases.put(g, step, max(known))


def add_jobs(phases: Phases, jobs: Iterable[Mapping[str, Any]], gang_of_job: Any,
             started_is_creation: bool) -> None:
    for job in jobs:
        g = gang_of_job(job)
        if g is None:
            continue
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        start = meta.get("creationTimestamp") if started_is_creation else status.get("startTime")
        phases.put(g, "job", ts(start))
        phases.put(g, "complete", ts(status.get("completionTime")))


def add_workloads(phases: Phases, workloads: Iterable[Mapping[str, Any]],
                  gang_of_job_name: Any) -> None:
    for wl in workloads:
        owner = next((r["name"] for r in (wl.get("metadata") or {}).get("ownerReferences") or ()
                      if r.get("kind") == "Job"), "")
        g = gang_of_job_name(owner)
        if g is None:
            continue
        phases.put(g, "admitted", _cond(wl, "Admitted"), latest=False)
        phases.put(g, "released", _cond(wl, "Finished"))


def capacity_bound(gpu_seconds: float, cluster_gpus: int, gangs: int) -> float:
    """The fastest possible admission rate (gangs/s): every GPU busy all the time, no
    overhead at all, perfect packing: the gangs over their total GPU-seconds / the GPUs."""
    return gangs / (gpu_seconds / cluster_gpus) if gpu_seconds > 0 else float("inf")


def next_admission_gaps(phases: Phases) -> list[float]:
    """For each release, the time until the next admission after it, while gangs waited."""
    admits = sorted(s["admitted"] for s in phases.at.values() if "admitted" in s)
    if not admits:
        return []
    gaps = []
    for s in phases.at.values():
        rel = s.get("released")
        if rel is None or rel >= admits[-1]:
            continue
        gaps.append(next(a for a in admits if a >= rel) - rel)
    return gaps


def rows(phases: Phases) -> list[tuple[str, int, float, float]]:
    """(phase, gangs measured, p50 s, p95 s) for each step and the totals."""
    out = []
    pairs = list(itertools.pairwise(STEPS))
    for label, (a, b) in zip(LABELS, pairs, strict=True):
        out.append((label, *_stats([s[b] - s[a] for s in phases.at.values()
                                    if a in s and b in s])))
    out.append(("held (admitted -> released)", *_stats(
        [s["released"] - s["admitted"] for s in phases.at.values()
         if "released" in s and "admitted" in s])))
    out.append(("release -> next admission", *_stats(next_admission_gaps(phases))))
    return out


def _stats(values: list[float]) -> tuple[int, float, float]:
    if not values:
        return 0, float("nan"), float("nan")
    values = sorted(values)
    return (len(values), statistics.median(values),
            values[min(len(values) - 1, int(0.95 * len(values)))])


def table(by_system: Mapping[str, Phases]) -> list[str]:
    """Markdown: one row per phase, p50 / p95 (gangs) per system."""
    names = list(by_system)
    lines = ["| phase | " + " | ".join(f"{n} p50 / p95 (gangs)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    measured = {n: rows(p) for n, p in by_system.items()}
    for i, (label, *_) in enumerate(measured[names[0]]):
        cells = [f"{m[i][2]:.1f} / {m[i][3]:.1f} s ({m[i][1]})" for m in
                 (measured[n] for n in names)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines
