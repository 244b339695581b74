"""The queued-jobs limits, checked at submit: a 429 naming the limit (policies.concurrency).

Counted before the submission joins its group commit, so submissions racing in the same
instant may pass a limit by the few that raced; the next ones are refused. An idempotent replay
(a known Idempotency-Key) is never refused: it adds no job.
"""

from __future__ import annotations

import asyncio

from broker.api.problems import Problem
from broker.config import IsthmusConfig
from broker.policy_inputs import caps
from broker.store import concurrency as counts
from broker.store.db import Database
from broker.store.queries import find_by_idempotency_key
from policies.concurrency import queued_problem

RETRY_AFTER_S = 60


def _limited(config: IsthmusConfig, team: str) -> bool:
    t = config.team(team)
    return (t is not None and t.limits.queued_jobs is not None) or \
        config.user_limits_of(team).queued_jobs is not None


def _problem(db: Database, config: IsthmusConfig, team: str, user: str, adding: int,
             key: str | None) -> tuple[str, str] | None:
    with db.read() as s:
        if key is not None and find_by_idempotency_key(s, team, key) is not None:
            return None
        team_n, user_n = counts.waiting_of(s, team, user)
    t = config.team(team)
    user_field = f"teams[{team}].user_limits" if t is not None and \
        t.user_limits.queued_jobs is not None else "user_limits"
    return queued_problem(caps(t.limits) if t else None, caps(config.user_limits_of(team)),
                          team, user, team_n, user_n, adding, user_field)


async def check_queued(db: Database, config: IsthmusConfig, team: str, user: str,
                       adding: int = 1, key: str | None = None) -> None:
    """Raise a 429 problem when `adding` more waiting jobs of `user` in `team` would pass a
    queued_jobs limit; costs nothing when no such limit is configured."""
    if not _limited(config, team):
        return
    got = await asyncio.to_thread(_problem, db, config, team, user, adding, key)
    if got is None:
        return
    field, message = got
    raise Problem(429, "concurrency-limit", "Concurrency limit reached", message,
                  [{"field": field, "message": message}],
                  headers={"Retry-After": str(RETRY_AFTER_S)})
