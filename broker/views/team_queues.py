"""Team queue view: each team's queues (`teams[].queues`) with their weights, the GPUs their
jobs hold and the jobs they have waiting, and each queue's fair-share standing: GPUs held per
unit of weight, the figure admission compares to pick a team's next job
(policies/ordering.py). A team without queues has one line, queue `default`, weight 1.

Counts are the live jobs table's (broker.store.concurrency), as the admission cycle reads
them."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from broker.config import IsthmusConfig, Team
from broker.store import concurrency as counts
from broker.store.db import Database


class QueueView(BaseModel):
    team: str
    team_weight: float
    """The team's fair-share weight among teams."""
    queue: str
    weight: float
    weight_fraction: float
    """This queue's weight over the sum of the team's queues' weights: its fair part."""
    gpus_held: int
    """GPUs held by the queue's admitted and running jobs."""
    held_per_weight: float
    """gpus_held / weight: the lowest goes next among the team's queues."""
    waiting_jobs: int


def team_queue_views(team: Team, held: Mapping[tuple[str, str], int],
                     waiting: Mapping[tuple[str, str], int]) -> list[QueueView]:
    """One line per queue of `team` (pure)."""
    weights = team.queue_weights()
    total = sum(weights.values())
    return [QueueView(team=team.name, team_weight=team.weight, queue=q, weight=w,
                      weight_fraction=w / total, gpus_held=held.get((team.name, q), 0),
                      held_per_weight=held.get((team.name, q), 0) / w,
                      waiting_jobs=waiting.get((team.name, q), 0))
            for q, w in weights.items()]


def read_queues(config: IsthmusConfig, db: Database, team: str | None = None) -> list[QueueView]:
    """Every team's queue lines; `team`: that team's only."""
    with db.read() as s:
        held = counts.held_by_queue(s)
        waiting = counts.waiting_by_queue(s, team)
    return [v for t in config.teams if team is None or t.name == team
            for v in team_queue_views(t, held, waiting)]


def queue_text(lines: list[QueueView], queue: str) -> str:
    """The explain lines of a job in `queue`, for a team with more than one queue ('' else)."""
    if len(lines) < 2:
        return ""
    mine = next((v for v in lines if v.queue == queue), None)
    if mine is None:
        return ""
    others = ", ".join(f"{v.queue} {v.gpus_held} GPUs / weight {v.weight:g}"
                       for v in lines if v.queue != queue)
    order = sorted(lines, key=lambda v: v.held_per_weight)
    rank = next(i for i, v in enumerate(order) if v.queue == queue) + 1
    return (f"queue {queue} of team {mine.team}: weight {mine.weight:g} "
            f"({mine.weight_fraction:.0%} of the team's), holds {mine.gpus_held} GPUs "
            f"({mine.held_per_weight:g} per unit of weight, {rank} of {len(lines)} in line "
            f"among the team's queues), {mine.waiting_jobs} jobs waiting; other queues: "
            f"{others}")
