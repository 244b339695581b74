"""A waiting job's message is news for a new reason, or new wording at most once a minute;
never for new figures alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.domain.reason_messages import FIGURES_EVERY_S, WORDING_EVERY_S, is_news, wording

QUOTA = ("team t-1 uses {u} of 20 nominal a100-80g GPUs and needs 4 more; cohort c2 has {a} "
         "a100-80g GPUs left to lend, short by {s}")
WITHIN = ("team t-1 uses {u} of 20 nominal a100-80g GPUs and needs 4 more; within nominal, but "
          "cohort c2 has lent out its a100-80g GPUs ({a} left); {s} must be reclaimed")
T0 = datetime(2026, 12, 5, tzinfo=UTC)
YOUNG = T0 + timedelta(seconds=5)
OLD = T0 + timedelta(seconds=WORDING_EVERY_S)
STALE = T0 + timedelta(seconds=FIGURES_EVERY_S)


@pytest.mark.parametrize(
    ("stored", "new", "now", "news"),
    [
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("QuotaExhausted", QUOTA.format(u=20, a=0, s=4)), OLD, False,
                     id="figures-only-not-within-five-minutes"),
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("QuotaExhausted", QUOTA.format(u=20, a=0, s=4)), STALE, True,
                     id="figures-refreshed-after-five-minutes"),
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)), OLD, False, id="same"),
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("InsufficientCapacity", QUOTA.format(u=18, a=3, s=1)), YOUNG, True,
                     id="new-reason-at-once"),
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("QuotaExhausted", WITHIN.format(u=18, a=0, s=1)), YOUNG, False,
                     id="new-wording-waits"),
        pytest.param(("QuotaExhausted", QUOTA.format(u=18, a=3, s=1)),
                     ("QuotaExhausted", WITHIN.format(u=18, a=0, s=1)), OLD, True,
                     id="new-wording-after-a-minute"),
        pytest.param(("InsufficientCapacity", "no room in pool-2"),
                     ("InsufficientCapacity", "no room in pool-3"), OLD, True,
                     id="a-number-in-a-name-is-wording"),
    ],
)
def test_is_news(stored: tuple[str, str], new: tuple[str, str], now: datetime,
                 news: bool) -> None:
    assert is_news(stored[0], stored[1], T0, new[0], new[1], now) is news


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("uses 18 of 20 nominal a100-80g GPUs (3 left), 0.5 h", "uses # of # nominal a100-80g "
         "GPUs (# left), # h"),
        ("retry backoff until 2026-12-05T10:00:00Z", "retry backoff until 2026-12-05T10:00:00Z"),
        ("team1 in pool-2 short by 4.", "team1 in pool-2 short by #."),
    ],
)
def test_wording_masks_figures_only(message: str, expected: str) -> None:
    assert wording(message) == expected
