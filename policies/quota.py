"""Quotas per team and flavor, in GPUs: nominal quota, borrowing inside a cohort, lending limits.

The model follows Kueue's cohorts. For each flavor a team has
- `nominal`: GPUs it owns;
- `lending_limit`: how many of those others may borrow (None: all); the rest, `guaranteed`,
  is capacity others may never borrow;
- `borrowing_limit`: how many GPUs above nominal it may use (None: as many as the cohort lends).
The cohort's lendable pool for a flavor is the sum of its members' lendable GPUs. A member's
usage above its guaranteed part draws on that pool, so a team working inside its own nominal
only competes with borrowers, and when they have taken its capacity it may reclaim it
(preemption of borrowed usage).

Checks, in order: the team is known; within nominal and the cohort pool holds it -> fits;
above nominal without a cohort -> QuotaExhausted; above the borrowing limit ->
BorrowLimitReached (QuotaExhausted when the limit is 0); the cohort pool cannot hold it ->
QuotaExhausted, with `reclaim` set when the request lies within the team's own nominal.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.reasons import Reason
from policies.types import QuotaConfig, Usage


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    ok: bool
    reason: Reason
    message: str
    borrowed: int = 0
    """GPUs of this request above the team's nominal quota."""
    reclaim: int = 0
    """GPUs lent out to borrowers that must be reclaimed (preempted) for this to fit."""


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """One (team, flavor) line of the ledger, for reports and explain."""

    team: str
    flavor: str
    nominal: int
    used: int
    borrowed: int
    borrowing_limit: int | None
    lending_limit: int | None


class QuotaState:
    """A working copy of the ledger for one admission cycle (reserve as jobs are admitted)."""

    def __init__(self, config: QuotaConfig, usage: Usage) -> None:
        self.config = config
        self.used: dict[tuple[str, str], int] = dict(usage.in_use)
        self.cohort_cap: dict[tuple[str, str], int] = {}
        self.cohort_used: dict[tuple[str, str], int] = {}
        for t in config.teams.values():
            if t.cohort is None:
                continue
            for flavor, fq in t.quotas.items():
                key = (t.cohort, flavor)
                self.cohort_cap[key] = self.cohort_cap.get(key, 0) + fq.lendable
        for (team, flavor), u in self.used.items():
            cohort = config.cohort_of(team)
            if cohort is not None:
                key = (cohort, flavor)
                g = config.quota(team, flavor).guaranteed
                self.cohort_used[key] = self.cohort_used.get(key, 0) + max(0, u - g)

    def line(self, team: str, flavor: str) -> QuotaLine:
        q = self.config.quota(team, flavor)
        u = self.used.get((team, flavor), 0)
        return QuotaLine(
            team, flavor, q.nominal, u, max(0, u - q.nominal), q.borrowing_limit, q.lending_limit
        )

    def cohort_available(self, cohort: str, flavor: str) -> int:
        key = (cohort, flavor)
        return self.cohort_cap.get(key, 0) - self.cohort_used.get(key, 0)

    def check(self, team: str, flavor: str, gpus: int) -> QuotaVerdict:
        if team not in self.config.teams:
            return QuotaVerdict(False, Reason.QuotaExhausted, f"team {team} has no quota")
        q = self.config.quota(team, flavor)
        u = self.used.get((team, flavor), 0)
        new = u + gpus
        borrow = max(0, new - q.nominal)
        borrow_delta = borrow - max(0, u - q.nominal)
        cohort = self.config.cohort_of(team)
        head = f"team {team} uses {u} of {q.nominal} nominal {flavor} GPUs and needs {gpus} more"
        if cohort is None:
            if borrow:
                return QuotaVerdict(
                    False, Reason.QuotaExhausted, f"{head}; it is in no cohort to borrow from"
                )
            return QuotaVerdict(True, Reason.Admitted, f"{head}; within nominal")
        limit = q.borrowing_limit
        if borrow and limit is not None and borrow > limit:
            if limit == 0:
                return QuotaVerdict(
                    False, Reason.QuotaExhausted, f"{head}; its borrowing limit is 0"
                )
            return QuotaVerdict(
                False,
                Reason.BorrowLimitReached,
                f"{head}; that borrows {borrow} above nominal, over its borrowing limit of "
                f"{limit} by {borrow - limit}",
            )
        g = q.guaranteed
        delta = max(0, new - g) - max(0, u - g)
        avail = self.cohort_available(cohort, flavor)
        if delta > avail:
            if not borrow:
                return QuotaVerdict(
                    False,
                    Reason.QuotaExhausted,
                    f"{head}; within nominal, but cohort {cohort} has lent out its {flavor} "
                    f"GPUs ({avail} left); {delta - avail} must be reclaimed from borrowers",
                    0,
                    delta - avail,
                )
            return QuotaVerdict(
                False,
                Reason.QuotaExhausted,
                f"{head}; that borrows {borrow} above nominal and cohort {cohort} has "
                f"{max(0, avail)} {flavor} GPUs left to lend, short by {delta - max(0, avail)}",
            )
        note = f"borrows {borrow_delta} from cohort {cohort}" if borrow_delta else "within nominal"
        return QuotaVerdict(True, Reason.Admitted, f"{head}; {note}", borrow_delta)

    def over_nominal(self, team: str, flavor: str, gpus: int) -> int | None:
        """GPUs the team would have to stop in `flavor` for `gpus` more to fit inside its
        nominal quota; None when the request alone is larger than that quota."""
        if team not in self.config.teams:
            return None
        nominal = self.config.quota(team, flavor).nominal
        if gpus > nominal:
            return None
        return max(0, self.used.get((team, flavor), 0) + gpus - nominal)

    def reserve(self, team: str, flavor: str, gpus: int) -> None:
        self._add(team, flavor, gpus)

    def release(self, team: str, flavor: str, gpus: int) -> None:
        self._add(team, flavor, -gpus)

    def _add(self, team: str, flavor: str, gpus: int) -> None:
        key = (team, flavor)
        u = self.used.get(key, 0)
        new = u + gpus
        if new < 0:
            raise ValueError(f"release of {-gpus} {flavor} GPUs by {team}, which uses {u}")
        self.used[key] = new
        cohort = self.config.cohort_of(team)
        if cohort is not None:
            g = self.config.quota(team, flavor).guaranteed
            ck = (cohort, flavor)
            delta = max(0, new - g) - max(0, u - g)
            self.cohort_used[ck] = self.cohort_used.get(ck, 0) + delta
