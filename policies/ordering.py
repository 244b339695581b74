"""Admission order: priority class, then fair share, then submission time.

Fair share is a dominant share: for each flavor, the team's recent GPU usage (the decayed
average kept in `Usage.decayed`, else the GPUs in use) divided by its nominal quota of that
flavor (at least 1) and multiplied by the flavor's cost weight; the largest over flavors,
divided by the team's weight. Lower shares go first. Inside one cycle a team's share grows with
every job admitted for it, so one team cannot take all capacity freed in a cycle just because
its first job was ahead.

Inside a team with queues (`TeamQuota.queue_weights`), the team's next job is the head of
the queue with the lowest GPUs held per unit of the queue's weight, within the best priority
level (and starving gangs first); a cycle charges each admission to its queue as to its team.

Teams are merged through a heap keyed by (head job priority, starving first, team share, head
submission time, job id); there is no one-job-per-queue-per-cycle limit. A starving gang (waiting
past `starvation_after_s`) goes first inside its priority level, oldest first whatever its
team's share, so that it takes or holds capacity before smaller jobs backfill around it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from policies.types import PendingJob, QuotaConfig, Usage


@dataclass(frozen=True, slots=True)
class OrderingParams:
    starvation_after_s: float = 3600.0
    """A gang waiting this long gets a capacity reservation when it does not fit."""
    reservation_min_gpus: int = 8
    """Smaller jobs never need a reservation: they fit in the gaps backfill leaves."""
    max_reservations: int = 4
    """Reservations per cycle: each holds capacity idle, so their number is bounded."""
    backfill: bool = True
    """Later jobs may use held GPUs where, by their time limits, they do not delay the
    gang's expected start (policies/backfill.py)."""
    queue_closed_after_s: float = 24 * 3600.0
    """A starving gang waiting this long guards the backend queue of the pool it holds
    capacity in (the backend, not knowing the hold, would start queued jobs on it): new jobs
    queued there exclude the held nodes (`queue_exclude`, where the backend can), else the
    queue closes (policies/queue_guard.py). Long: both cost small jobs
    (docs/benchmarks/history/2026-11-29..12-05.md, 2026-12-01 sessions 5 and 6)."""
    queue_exclude: bool = True
    """Guard by excluding the held nodes, in pools whose backend honours exclusions
    (`PoolSnapshot.excludes_nodes`); off, or elsewhere: close the queue."""
    backfill_factor: float = 1.0
    """A backfilled job's time limit counts this many times (a safety margin, >= 1)."""
    backfill_margin_s: float = 420.0
    """Seconds added to a backfilled job's time limit: a backend runs a job past its declared
    limit (Slurm: up to 59 s of rounding to whole minutes plus KillWait, 30 s by default;
    Kubernetes: the gang's start-up timeout, 300 s by default) and the limit counts from the
    job's start in the backend, after dispatch, not from the admission cycle."""


class FairShare:
    """Dominant shares per team, and GPUs held per unit of weight per queue of a team with
    queues, charged as the cycle admits jobs."""

    def __init__(self, quotas: QuotaConfig, usage: Usage) -> None:
        self.quotas = quotas
        self._queue_gpus: dict[tuple[str, str], float] = {
            k: float(v) for k, v in usage.queue_gpus.items()}
        self._use: dict[str, dict[str, float]] = defaultdict(dict)
        for (team, flavor), v in usage.in_use.items():
            self._use[team][flavor] = float(v)
        for (team, flavor), dv in usage.decayed.items():
            self._use[team][flavor] = dv
        self._share: dict[str, float] = {}
        for team in list(self._use):
            self._recompute(team)

    def _recompute(self, team: str) -> None:
        t = self.quotas.teams.get(team)
        weight = t.weight if t is not None and t.weight > 0 else 1.0
        best = 0.0
        for flavor, used in self._use[team].items():
            if used <= 0:
                continue
            nominal = self.quotas.quota(team, flavor).nominal
            s = used / max(1, nominal) * self.quotas.cost(flavor)
            best = max(best, s)
        self._share[team] = best / weight

    def share(self, team: str) -> float:
        return self._share.get(team, 0.0)

    def queue_share(self, team: str, queue: str) -> float:
        """GPUs the queue holds per unit of its weight (0 for a team without queues)."""
        t = self.quotas.teams.get(team)
        if t is None or len(t.queue_weights) < 2:
            return 0.0
        weight = t.queue_weights.get(queue, 1.0)
        return self._queue_gpus.get((team, queue), 0.0) / (weight if weight > 0 else 1.0)

    def charge(self, team: str, flavor: str, gpus: int, queue: str | None = None) -> None:
        use = self._use[team]
        use[flavor] = use.get(flavor, 0.0) + gpus
        self._recompute(team)
        if queue is not None:
            key = (team, queue)
            self._queue_gpus[key] = self._queue_gpus.get(key, 0.0) + gpus


class FairQueue:
    """Pops jobs in admission order; the share is read again each time a team's next job is
    queued, so charges made by admissions take effect at once."""

    def __init__(
        self,
        jobs: Iterable[PendingJob],
        share: FairShare,
        now: datetime | None = None,
        params: OrderingParams | None = None,
    ) -> None:
        self.share = share
        p = params or OrderingParams()
        by_queue: dict[str, dict[str, list[PendingJob]]] = defaultdict(lambda: defaultdict(list))
        for j in jobs:
            by_queue[j.team][j.queue].append(j)
        self._starving: set[str] = set()
        if now is not None:
            self._starving = {j.id for qs in by_queue.values() for js in qs.values()
                              for j in js if is_starving(j, now, p)}

        def key(j: PendingJob) -> tuple[int, int, datetime, str]:
            return (-j.priority, 0 if j.id in self._starving else 1, j.submitted_at, j.id)

        # per team, per queue: jobs in reverse admission order (the next one last)
        self._lists = {t: {q: sorted(js, key=key, reverse=True) for q, js in qs.items()}
                       for t, qs in by_queue.items()}
        self._heap: list[tuple[int, int, float, datetime, str, str, str]] = []
        for team in sorted(self._lists):
            self._push(team)

    def _next_queue(self, team: str) -> str | None:
        """The team's queue whose head goes next: best priority, starving first, then the
        lowest GPUs held per unit of weight, then the oldest."""
        best: tuple[int, int, float, datetime, str] | None = None
        chosen = None
        for queue, lst in self._lists[team].items():
            h = lst[-1]
            starving = h.id in self._starving
            k = (-h.priority, 0 if starving else 1,
                 0.0 if starving else self.share.queue_share(team, queue), h.submitted_at, h.id)
            if best is None or k < best:
                best, chosen = k, queue
        return chosen

    def _push(self, team: str) -> None:
        queue = self._next_queue(team)
        if queue is not None:
            h = self._lists[team][queue][-1]
            if h.id in self._starving:  # oldest starving gang first, whatever its team's share
                entry = (-h.priority, 0, 0.0, h.submitted_at, h.id, team, queue)
            else:
                entry = (-h.priority, 1, self.share.share(team), h.submitted_at, h.id, team,
                         queue)
            heapq.heappush(self._heap, entry)

    def pop(self) -> PendingJob | None:
        """The next job; call `done` with its team after deciding on it."""
        if not self._heap:
            return None
        entry = heapq.heappop(self._heap)
        queues = self._lists[entry[5]]
        lst = queues[entry[6]]
        job = lst.pop()
        if not lst:  # an emptied queue leaves the scan of its team's queues
            del queues[entry[6]]
        return job

    def done(self, team: str) -> None:
        self._push(team)

    def __len__(self) -> int:
        return sum(len(v) for qs in self._lists.values() for v in qs.values())


def admission_order(
    jobs: Iterable[PendingJob],
    quotas: QuotaConfig,
    usage: Usage,
    now: datetime | None = None,
    params: OrderingParams | None = None,
) -> list[PendingJob]:
    """The order a cycle would consider `jobs` in if none of them were admitted."""
    fq = FairQueue(jobs, FairShare(quotas, usage), now, params)
    out: list[PendingJob] = []
    while (j := fq.pop()) is not None:
        out.append(j)
        fq.done(j.team)
    return out


def is_starving(job: PendingJob, now: datetime, params: OrderingParams) -> bool:
    waited = (now - job.submitted_at).total_seconds()
    return waited >= params.starvation_after_s and job.total_gpus >= params.reservation_min_gpus
