"""Quota view: per team and flavor, the configured limits against the live ledger.

`used` and `borrowed` are the ledger's live counters (`quota_usage`, the GPUs reserved by
admitted and running attempts, and the part of them above nominal). `lent_out` is how much of
the team's idle lendable quota its cohort's borrowers use: a cohort's borrowing is drawn from a
shared pool, not from one lender, so the borrowed GPUs are shared among the idle lenders in
proportion to what each leaves idle (largest remainders, so that the cohort's lent out sums
to what its members borrow, capped by what they can lend). `waiting_gpus` is the GPUs of the
team's QUEUED jobs that accept the flavor: a job that accepts two flavors counts in both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from broker import ledger
from broker.config import IsthmusConfig
from broker.domain.spec import JobSpec
from broker.feasibility import acceptable_flavors
from broker.store.db import Database
from broker.store.reports import QueuedJob, queued_jobs


class QuotaView(BaseModel):
    team: str
    flavor: str
    cohort: str | None
    nominal: int
    borrowing_limit: int | None
    """GPUs it may use above nominal; None: as many as the cohort lends."""
    lending_limit: int | None
    """GPUs of its nominal others may borrow; None: all of them."""
    used: int
    borrowed: int
    lent_out: int
    waiting_jobs: int
    waiting_gpus: int


def _lendable_idle(config: IsthmusConfig, used: Mapping[tuple[str, str], int],
                   team: str, flavor: str) -> int:
    t = config.team(team)
    q = t.quotas.get(flavor) if t else None
    if q is None:
        return 0
    lendable = q.nominal if q.lending_limit is None else min(q.lending_limit, q.nominal)
    return max(0, min(lendable, q.nominal - used.get((team, flavor), 0)))


def lent_out(config: IsthmusConfig, used: Mapping[tuple[str, str], int],
             borrowed: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """GPUs each (team, flavor) lends to its cohort's borrowers (pure; see module doc)."""
    out: dict[tuple[str, str], int] = {}
    cohorts: dict[tuple[str, str], list[str]] = defaultdict(list)
    for t in config.teams:
        if t.cohort is not None:
            for flavor in t.quotas:
                cohorts[(t.cohort, flavor)].append(t.name)
    for (_, flavor), members in cohorts.items():
        idle = {m: _lendable_idle(config, used, m, flavor) for m in members}
        total_idle = sum(idle.values())
        demand = min(total_idle, sum(borrowed.get((m, flavor), 0) for m in members))
        if demand <= 0:
            continue
        shares = {m: demand * idle[m] / total_idle for m in members}
        floor = {m: int(v) for m, v in shares.items()}
        rest = demand - sum(floor.values())
        for m in sorted(members, key=lambda m: (-(shares[m] - floor[m]), m))[:rest]:
            floor[m] += 1
        for m, g in floor.items():
            out[(m, flavor)] = g
    return out


def waiting_demand(config: IsthmusConfig, jobs: Iterable[QueuedJob]
                   ) -> dict[tuple[str, str], tuple[int, int]]:
    """(jobs, GPUs) waiting per (team, flavor) the jobs accept (pure). Specs are parsed once
    per distinct spec hash; a stored spec that no longer parses counts in no flavor."""
    flavors_of: dict[str, list[str]] = {}
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for j in jobs:
        names = flavors_of.get(j.spec_hash)
        if names is None:
            try:
                spec = JobSpec.model_validate_json(j.spec_json)
                names = [f.name for f in acceptable_flavors(config, spec)]
            except ValueError:
                names = []
            flavors_of[j.spec_hash] = names
        for f in names:
            n, g = out.get((j.team, f), (0, 0))
            out[(j.team, f)] = (n + 1, g + j.total_gpus)
    return out


def quota_views(
    config: IsthmusConfig, usage: Mapping[tuple[str, str], tuple[int, int]],
    waiting: Mapping[tuple[str, str], tuple[int, int]], team: str | None = None,
) -> list[QuotaView]:
    """One line per configured (team, flavor) quota, plus any (team, flavor) the ledger or the
    queue holds without a quota (nominal 0); `team`: only that team's lines (pure)."""
    used = {k: v[0] for k, v in usage.items()}
    borrowed = {k: v[1] for k, v in usage.items()}
    lent = lent_out(config, used, borrowed)
    keys = {(t.name, f) for t in config.teams for f in t.quotas} | set(usage) | set(waiting)
    out = []
    for tname, flavor in sorted(keys):
        if team is not None and tname != team:
            continue
        t = config.team(tname)
        q = t.quotas.get(flavor) if t else None
        jobs, gpus = waiting.get((tname, flavor), (0, 0))
        out.append(QuotaView(
            team=tname, flavor=flavor, cohort=t.cohort if t else None,
            nominal=q.nominal if q else 0,
            borrowing_limit=q.borrowing_limit if q else 0,
            lending_limit=q.lending_limit if q else 0,
            used=used.get((tname, flavor), 0), borrowed=borrowed.get((tname, flavor), 0),
            lent_out=lent.get((tname, flavor), 0), waiting_jobs=jobs, waiting_gpus=gpus,
        ))
    return out


def read_quotas(config: IsthmusConfig, db: Database, team: str | None = None) -> list[QuotaView]:
    """The quota views from the ledger and the queue; `team`: only that team's lines.
    Lending is computed over the whole cohort either way."""
    with db.read() as s:
        usage = ledger.usage(s)
        queued = queued_jobs(s, team)
    return quota_views(config, usage, waiting_demand(config, queued), team)
