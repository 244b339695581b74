"""Team queue view: each team's queues (`teams[].queues`) with their weights, the GPUs their
jobs hold and the jobs they have waiting, and each queue's fair-share standing: GPUs held per
unit of weight, the figure admission compares to pick a team's next job
(policies/ordering.py); and a queue's share of the team's quota with the GPUs of each flavor
it allows and holds (policies/queue_share.py). A team without queues has one line, queue
`default`, weight 1, that counts all its jobs (their `queue` is a free label then). A queue
that jobs still name but the configuration no longer lists has a line of its own, weight 1
(as admission weighs it), no share, marked not configured.

Counts are the live jobs table's (broker.store.concurrency), as the admission cycle reads
them."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from broker.config import IsthmusConfig, Team
from broker.policy_inputs import quota_config
from broker.store import concurrency as counts
from broker.store.db import Database
from policies import queue_share
from policies.types import QuotaConfig


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
    share: float | None = None
    """teams[].queues[].share: the most of the team's quota the queue may hold (None: no cap
    of its own)."""
    share_gpus: dict[str, int] = Field(default_factory=dict)
    """With a share, per flavor of the team's quotas: the GPUs the share lets the queue hold at
    once (floor(share x (nominal + what the team may borrow)))."""
    gpus_held_by_flavor: dict[str, int] = Field(default_factory=dict)
    """With a share, per flavor: the GPUs the queue's jobs hold."""


def _by_queue(team: Team, counts: Mapping[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (t, label), n in counts.items():
        if t == team.name:
            q = team.queue_of(label)
            out[q] = out.get(q, 0) + n
    return out


def _share_lines(team: Team, quotas: QuotaConfig | None,
                 held: Mapping[tuple[str, str, str], int]
                 ) -> dict[str, tuple[float, dict[str, int], dict[str, int]]]:
    """Per queue with a share: the share, the GPUs it allows and the GPUs held, per flavor."""
    if quotas is None:
        return {}
    out = {}
    for q, s in team.queue_shares().items():
        caps = {f: queue_share.cap(s, queue_share.reach(quotas, team.name, f))
                for f in sorted(team.quotas)}
        out[q] = (s, caps, {f: held.get((team.name, q, f), 0) for f in caps})
    return out


def team_queue_views(team: Team, held: Mapping[tuple[str, str], int],
                     waiting: Mapping[tuple[str, str], int],
                     quotas: QuotaConfig | None = None,
                     held_by_flavor: Mapping[tuple[str, str, str], int] | None = None,
                     ) -> list[QueueView]:
    """One line per queue of `team`, then one per queue its jobs name that it no longer
    configures (pure). `quotas`: every team's (a share's cap counts what the cohort lends)."""
    weights = team.queue_weights()
    shares = _share_lines(team, quotas, held_by_flavor or {})
    mine_held, mine_waiting = _by_queue(team, held), _by_queue(team, waiting)
    stale = sorted((set(mine_held) | set(mine_waiting)) - set(weights))
    total = sum(weights.values()) + len(stale)
    lines = [(q, w, True) for q, w in weights.items()] + [(q, 1.0, False) for q in stale]
    return [QueueView(team=team.name, team_weight=team.weight, queue=q, weight=w,
                      weight_fraction=w / total, gpus_held=mine_held.get(q, 0),
                      held_per_weight=mine_held.get(q, 0) / w,
                      waiting_jobs=mine_waiting.get(q, 0), configured=configured,
                      **_share_fields(shares.get(q)))
            for q, w, configured in lines]


def _share_fields(line: tuple[float, dict[str, int], dict[str, int]] | None
                  ) -> dict[str, object]:
    if line is None:
        return {}
    return {"share": line[0], "share_gpus": line[1], "gpus_held_by_flavor": line[2]}


def read_queues(config: IsthmusConfig, db: Database, team: str | None = None) -> list[QueueView]:
    """Every team's queue lines; `team`: that team's only."""
    shared = any(t.queue_shares() for t in config.teams if team is None or t.name == team)
    with db.read() as s:
        held = counts.held_by_queue(s)
        waiting = counts.waiting_by_queue(s, team)
        by_flavor = counts.held_by_queue_flavor(s, team) if shared else {}
    quotas = quota_config(config) if shared else None
    return [v for t in config.teams if team is None or t.name == team
            for v in team_queue_views(t, held, waiting, quotas, by_flavor)]


def queue_text(lines: list[QueueView], queue: str) -> str:
    """The explain lines of a job in `queue`, for a team with more than one queue or a queue
    with a share ('' else)."""
    mine = next((v for v in lines if v.queue == queue), None)
    if mine is None or (len(lines) < 2 and mine.share is None):
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
            f"waiting{share_text(mine)}" + (f"; other queues: {others}" if others else ""))


def share_text(line: QueueView) -> str:
    """`; share 50% of the team's quota: holds h100-80g 16 of 16, a100-80g 0 of 32 GPUs`
    ('' for a queue without a share)."""
    if line.share is None:
        return ""
    held = ", ".join(f"{f} {line.gpus_held_by_flavor.get(f, 0)} of {c}"
                     for f, c in line.share_gpus.items())
    return (f"; share {queue_share.percent(line.share)} of the team's quota (a cap: of its "
            f"nominal plus what it may borrow): holds {held or 'no flavor'} GPUs")
