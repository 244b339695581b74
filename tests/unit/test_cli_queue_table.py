"""`isthmus quotas`'s team queue table renders GET /v1/queues's lines: each queue's share with
the GPUs it holds and allows per flavor, `-` without one; a team whose one queue has a share
is listed too."""

from __future__ import annotations

from typing import Any

import pytest

from broker.cli import admin_views
from broker.cli.output import console

QUEUES = [
    {"team": "vision", "team_weight": 1.0, "queue": "research", "weight": 1.0,
     "weight_fraction": 0.5, "gpus_held": 16, "held_per_weight": 16.0, "waiting_jobs": 1,
     "configured": True, "share": 0.5, "share_gpus": {"a100-80g": 40, "h100-80g": 16},
     "gpus_held_by_flavor": {"a100-80g": 0, "h100-80g": 16}},
    {"team": "vision", "team_weight": 1.0, "queue": "prod", "weight": 1.0,
     "weight_fraction": 0.5, "gpus_held": 8, "held_per_weight": 8.0, "waiting_jobs": 0,
     "configured": True, "share": None, "share_gpus": {}, "gpus_held_by_flavor": {}},
    {"team": "language", "team_weight": 1.0, "queue": "solo", "weight": 1.0,
     "weight_fraction": 1.0, "gpus_held": 0, "held_per_weight": 0.0, "waiting_jobs": 0,
     "configured": True, "share": 0.125, "share_gpus": {"a100-80g": 2},
     "gpus_held_by_flavor": {"a100-80g": 0}},
    {"team": "audio", "team_weight": 1.0, "queue": "default", "weight": 1.0,
     "weight_fraction": 1.0, "gpus_held": 0, "held_per_weight": 0.0, "waiting_jobs": 0,
     "configured": True, "share": None, "share_gpus": {}, "gpus_held_by_flavor": {}},
]


def test_the_queue_table_shows_each_share(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: dict[str, Any] = {"quota_views": [], "queue_views": QUEUES, "limit_views": [],
                               "budget_views": []}
    monkeypatch.setattr(admin_views, "call", lambda _s, _t, fn, *a: answers.get(fn, []))
    with console.capture() as cap:
        admin_views.quotas(server="http://127.0.0.1:1", token=None)
    out = cap.get()
    assert "SHARE" in out, out
    rows = {line.split("│")[3].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in out.splitlines() if line.count("│") > 5}
    assert rows["research"][4] == "50% (a100-80g 0/40, h100-80g 16/16)", rows
    assert rows["prod"][4] == "-", rows
    assert rows["solo"][4] == "12.5% (a100-80g 0/2)", rows  # one queue, with a share
    assert "default" not in rows, rows  # one queue, no share: nothing split
