"""A team queue's share of its team's quota (`teams[].queues[].share`): a cap, per flavor.

The models are Slurm's sub-account GrpTRES (a child account's limit inside its parent's) and
KAI Scheduler's queue limits: a share bounds what a queue's jobs may hold at once; it reserves
nothing, so the shares of a team's queues may add up to more than 1, and a queue without a
share is bounded by its team's quota only.

For a flavor, the team may hold at most its `reach`: its nominal quota, plus what it may borrow
(outside a cohort nothing; inside one, the lendable GPUs of the cohort's other members, at most
its borrowing limit). This is the configuration's figure, not what the cohort has left to lend
now, so a cap does not move as other teams come and go. The queue's cap is
floor(share x reach): a cap is never exceeded by rounding.

Admission asks `QueueShares.check` per acceptable flavor before the team's quota: a job whose
queue would hold more than its cap of that flavor does not take it (QueueShareReached, naming
the queue, its share and the figures). What the queue holds counts the admitted and running
jobs of the queue (`Usage.queue_flavor_gpus`) and every admission of the cycle (`charge`).
Preemption does not help a queue past its share, and other queues of the team are not affected.
"""

from __future__ import annotations

import math

from policies.types import PendingJob, QuotaConfig, Usage


def reach(quotas: QuotaConfig, team: str, flavor: str) -> int:
    """The most GPUs of `flavor` the team may hold: nominal plus what it may borrow."""
    q = quotas.quota(team, flavor)
    cohort = quotas.cohort_of(team)
    if cohort is None:
        return q.nominal
    lendable = sum(t.quotas[flavor].lendable for t in quotas.teams.values()
                   if t.cohort == cohort and t.name != team and flavor in t.quotas)
    limit = q.borrowing_limit
    return q.nominal + (lendable if limit is None else min(limit, lendable))


def cap(share: float, team_reach: int) -> int:
    """floor(share x reach), rounding errors of the product aside (0.29 x 100 is 29)."""
    return max(0, math.floor(share * team_reach + 1e-9))


def percent(share: float) -> str:
    """`50%`, `12.5%`, `33.3%`."""
    return f"{share * 100:.3g}%"


def describe(team: str, share: float, flavor: str, quotas: QuotaConfig) -> str:
    """`50% of the 32 h100 GPUs team vision may hold (nominal 32, borrowable 0)`."""
    r = reach(quotas, team, flavor)
    nominal = quotas.quota(team, flavor).nominal
    return (f"{percent(share)} of the {r} {flavor} GPUs team {team} may hold (nominal "
            f"{nominal}, borrowable {r - nominal})")


class QueueShares:
    """The caps of the queues with a share and what those queues hold, charged as a cycle
    admits jobs."""

    def __init__(self, quotas: QuotaConfig, usage: Usage) -> None:
        self.quotas = quotas
        self.held: dict[tuple[str, str, str], int] = dict(usage.queue_flavor_gpus)
        self._caps: dict[tuple[str, str, str], int | None] = {}

    def share(self, team: str, queue: str) -> float | None:
        t = self.quotas.teams.get(team)
        return None if t is None else t.queue_shares.get(queue)

    def cap(self, team: str, queue: str, flavor: str) -> int | None:
        """GPUs of `flavor` the queue may hold at once; None: no share, no cap of its own."""
        key = (team, queue, flavor)
        if key in self._caps:  # asked for every flavor of every job: computed once
            return self._caps[key]
        s = self.share(team, queue)
        c = self._caps[key] = None if s is None else cap(s, reach(self.quotas, team, flavor))
        return c

    def check(self, job: PendingJob, flavor: str) -> str | None:
        """None when the job's queue may take `job` in `flavor`; else why not (the message of
        QueueShareReached)."""
        key = (job.team, job.queue, flavor)
        c = self._caps[key] if key in self._caps else self.cap(*key)
        if c is None:
            return None
        held = self.held.get(key, 0)
        if held + job.total_gpus <= c:
            return None
        s = self.share(job.team, job.queue)
        assert s is not None
        return (f"queue {job.queue} holds {held} of the {c} {flavor} GPUs its share allows "
                f"({describe(job.team, s, flavor, self.quotas)}) and needs "
                f"{job.total_gpus} more")

    def charge(self, job: PendingJob, flavor: str) -> None:
        key = (job.team, job.queue, flavor)
        self.held[key] = self.held.get(key, 0) + job.total_gpus


def configured(quotas: QuotaConfig) -> bool:
    """Some queue has a share (else admission keeps no QueueShares)."""
    return any(t.queue_shares for t in quotas.teams.values())
