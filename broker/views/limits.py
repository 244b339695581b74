"""Concurrency limit view: per team, and per user with jobs, each limit against its count.

A team line shows `teams[].limits`; a user line (one per user with jobs held or waiting)
shows the limits in effect for that user (`teams[].user_limits` over the top-level
`user_limits`). Counts are the live jobs table's (broker.store.concurrency): running jobs and
GPUs held are what admission checks, queued jobs what submit checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel

from broker.config import ConcurrencyLimits, IsthmusConfig
from broker.store import concurrency as counts
from broker.store.db import Database


class LimitView(BaseModel):
    scope: Literal["team", "user"]
    team: str
    user: str | None
    running_jobs: int
    running_jobs_limit: int | None
    queued_jobs: int
    queued_jobs_limit: int | None
    gpus: int
    gpus_limit: int | None


def _line(scope: Literal["team", "user"], team: str, user: str | None,
          limits: ConcurrencyLimits, held: tuple[int, int], waiting: int) -> LimitView:
    return LimitView(scope=scope, team=team, user=user, running_jobs=held[0],
                     running_jobs_limit=limits.running_jobs, queued_jobs=waiting,
                     queued_jobs_limit=limits.queued_jobs, gpus=held[1],
                     gpus_limit=limits.gpus)


def limit_views(config: IsthmusConfig, held: Mapping[tuple[str, str], tuple[int, int]],
                waiting: Mapping[tuple[str, str], int], team: str | None = None
                ) -> list[LimitView]:
    """Team lines for teams with a limit or with jobs; user lines for users with jobs and a
    limit in effect (pure)."""
    out: list[LimitView] = []
    users = sorted(set(held) | set(waiting))
    names = sorted({t.name for t in config.teams} | {t for t, _ in users})
    for name in names:
        if team is not None and name != team:
            continue
        t = config.team(name)
        mine = [(u, held.get((name, u), (0, 0)), waiting.get((name, u), 0))
                for tn, u in users if tn == name]
        team_limits = t.limits if t else ConcurrencyLimits()
        if team_limits != ConcurrencyLimits() or mine:
            out.append(_line("team", name, None, team_limits,
                             (sum(h[0] for _, h, _ in mine), sum(h[1] for _, h, _ in mine)),
                             sum(w for _, _, w in mine)))
        user_limits = config.user_limits_of(name)
        if user_limits != ConcurrencyLimits():
            out += [_line("user", name, u, user_limits, h, w) for u, h, w in mine]
    return out


def read_limits(config: IsthmusConfig, db: Database, team: str | None = None) -> list[LimitView]:
    with db.read() as s:
        held = counts.held_by_user(s)
        waiting = counts.waiting_by_user(s, team)
    return limit_views(config, held, waiting, team)
