"""Which gangs `K8sBackend.observe` judges, and the gangs it forgot.

The Job and pod watch caches would otherwise hold every finished gang until the Job's
`ttlSecondsAfterFinished` (a week by default) deletes it, and every observe call would judge
them all: memory and time growing with a week of finished work. The reconciler asks about the
live attempts only (`observe(names)`) and reads the facts of other objects only to find
orphans that have not ended; so a finished Job it no longer asks about needs no fact, and once
it has been finished for `forget_finished_after_s` its Job and pods leave the caches.

Finished means a Complete or Failed condition (nothing undoes it). The grace covers a pass
whose list of names was read just before a dispatch: by the time a gang has been finished
that long, every pass asks about it until the broker has recorded its end. A gang asked about
again after it was forgotten is read directly (`K8sBackend.lookup`), never reported missing.

What forgetting costs, kept here on purpose (`Forgotten`): each forgotten gang's name and
namespace, so that `logs`, `lookup` and `cancel` still find it in per-team namespaces (healthy
caches answer alone there), kept as long as Kubernetes keeps the Job (for ever without a TTL);
without per-team namespaces only for an hour. Each time the broker asks about a forgotten
gang its entry is kept anew. A watch event of a forgotten object puts it back in the cache
until the next observe; a re-list (410 Gone) brings them back once: Jobs and pods (a finished
pod whose gang has no Job in the cache and is not asked about is dropped too); Kueue
Workloads only with their Jobs (a Workload-only re-list keeps them until their Job goes).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from backends.k8s.pod_evidence import parse_time

JSON = dict[str, Any]
KEEP_AT_LEAST = timedelta(hours=1)
"""How long a forgotten gang's name is kept when no namespace lookup needs it longer."""


def finished_at(job: Mapping[str, Any]) -> datetime | None:
    """When the Job got its Complete or Failed condition; None while it has neither (or,
    conservatively, when the condition carries no time)."""
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return (parse_time(cond.get("lastTransitionTime"))
                    or parse_time((job.get("status") or {}).get("completionTime")))
    return None


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """The pod ran to its end (Succeeded or Failed): nothing will change it but its deletion."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Selection:
    """One observe call's split of the Jobs: those to judge, and the finished ones nobody
    asked about that have been finished longer than the grace (to forget)."""

    judge: list[JSON]
    forget: list[JSON]


def select(jobs: Iterable[JSON], wanted: set[str] | None, now: datetime,
           grace: timedelta, skip: set[str] | frozenset[str] = frozenset()) -> Selection:
    """`wanted` None (every Job, as observe() without names) judges them all. Otherwise a
    Job is judged when it is wanted or has not finished (orphan detection needs it); a
    finished unwanted Job is skipped, and forgotten once finished longer than `grace`.
    Jobs named in `skip` are neither judged nor forgotten (the caller reads them)."""
    judge: list[JSON] = []
    forget: list[JSON] = []
    for job in jobs:
        if wanted is None:
            judge.append(job)
            continue
        name = str((job.get("metadata") or {}).get("name", ""))
        if name in skip:
            continue
        ended = None if name in wanted else finished_at(job)
        if ended is None:
            judge.append(job)
        elif now - ended >= grace:
            forget.append(job)
    return Selection(judge, forget)


class Forgotten:
    """Forgotten gangs: name -> (namespace, when last forgotten or asked about), oldest first
    (insertion order, so pruning stops at the first entry young enough to keep). `keep` None:
    kept for ever (Jobs without a TTL live for ever, and so must their names)."""

    def __init__(self, keep: timedelta | None) -> None:
        self.keep = None if keep is None else max(keep, KEEP_AT_LEAST)
        self._entries: dict[str, tuple[str, datetime]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def note(self, name: str, namespace: str, now: datetime) -> None:
        if name not in self._entries:  # namespaces repeat: one string each
            self._entries[name] = (sys.intern(namespace), now)

    def touch(self, name: str, now: datetime) -> None:
        """The broker still asks about it: kept `keep` from now (a gang forgotten while its
        attempt was not yet in the reconciler's list must not expire while it is asked)."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._entries[name] = (entry[0], now)

    def namespace(self, name: str) -> str | None:
        entry = self._entries.get(name)
        return entry[0] if entry is not None else None

    def prune(self, now: datetime) -> None:
        entries = self._entries
        if self.keep is None:
            return
        while entries:  # oldest first; no copy of the whole map on every pass
            name = next(iter(entries))
            if now - entries[name][1] <= self.keep:
                break
            del entries[name]
