"""Team queue view: each team's queues (`teams[].queues`) with their weights, the GPUs their
jobs hold and the jobs they have waiting, and each queue's fair-share standing: GPUs held per
unit of weight, the figure admission compares to pick a team's next job
(policies/ordering.py). A team without queues has one line, queue `default`, weight 1, that
counts all its jobs (their `queue` is a free label then). A queue that jobs still name but
the configuration no longer lists has a line of its own, weight 1 (as admission weighs it),
marked not configured.

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
    configured: bool = True
    """False for a queue jobs name that teams[].queues no longer lists."""


def _by_queue(team: Team, counts: Mapping[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (t, label), n in counts.items():
        if t == team.name:
            q = team.queue_of(label)
            out[q] = out.get(q, 0) + n
    return out


def team_queue_views(team: Team, held: Mapping[tuple[str, str], int],
                     waiting: Mapping[tuple[str, str], int]) -> list[QueueView]:
    """One line per queue of `team`, then one per queue its jobs name that it no longer
    configures (pure)."""
    weights = team.queue_weights()
    mine_held, mine_waiting = _by_queue(team, held), _by_queue(team, waiting)
    stale = sorted((set(mine_held) | set(mine_waiting)) - set(weights))
    total = sum(weights.values()) + len(stale)
    lines = [(q, w, True) for q, w in weights.items()] + [(q, 1.0, False) for q in stale]
    return [QueueView(team=team.name, team_weight=team.weight, queue=q, weight=w,
                      weight_fraction=w / total, gpus_held=mine_held.get(q, 0),
                      held_per_weight=mine_held.get(q, 0) / w,
                      waiting_jobs=mine_waiting.get(q, 0), configured=configured)
            for q, w, configured in lines]


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
    stale = "" if mine.configured else " (no longer configured: weight 1)"
    # no rank: which queue goes next also depends on the heads' priorities and starvation,
    # which admission weighs per cycle (policies/ordering.py)
    return (f"queue {queue} of team {mine.team}{stale}: weight {mine.weight:g} "
            f"({mine.weight_fraction:.0%} of the team's), holds {mine.gpus_held} GPUs "
            f"({mine.held_per_weight:g} per unit of weight; among the team's jobs of one "
            f"priority, the queue with the fewest goes first), {mine.waiting_jobs} jobs "
            f"waiting; other queues: {others}")
