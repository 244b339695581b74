"""The soak's RSS growth (`bench.soak.rss_growth`): counted apart for each stretch in which a
process kept one role, so that a standby taking over the control loop (and with it the
backends' caches) is not reported as memory growing over time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.soak import rss_growth

# the real-cluster soak of 2026-12-02 06:02 (branch k8s-forget), replica b: a standby for five
# minutes, the leader after a was killed (a: restarted, a new process)
B = [121.6, 122.3, 122.5, 122.5, 122.7, 213.8, 214.2, 214.8, 215.0, 215.2]
LEADERS = ["a"] * 5 + ["b"] * 5


def _rows(rss: list[float], leaders: Sequence[str | None]) -> dict[int, dict[str, Any]]:
    return {m: {"rss": {"a": 150.0, "b": v}, "leader": leaders[m]} for m, v in enumerate(rss)}


def test_a_takeover_is_a_new_stretch_not_growth() -> None:
    growth = rss_growth(_rows(B, LEADERS), ["a", "b"], {"killed_a": 300}, warmup=2)
    # standby 122.5 -> 122.7 (minutes 3-5), leader 214.8 -> 215.2 (minutes 8-10)
    assert 0.1 < growth < 0.3, growth


def test_growth_within_one_role_still_counts() -> None:
    leaking = [100.0 + 10 * m for m in range(10)]
    growth = rss_growth(_rows(leaking, ["b"] * 10), ["a", "b"], {"killed_a": 300}, warmup=2)
    assert round(growth) == round((190 / 120 - 1) * 100)


def test_a_minute_without_a_known_leader_keeps_the_role_before_it() -> None:
    leaders: list[str | None] = ["a"] * 5 + [None] + ["b"] * 4
    rss = [*B[:5], 122.9, *B[6:]]
    growth = rss_growth(_rows(rss, leaders), ["a", "b"], {"killed_a": 300}, warmup=2)
    assert 0.1 < growth < 0.4, growth  # minute 6 stays a standby one: 122.5 -> 122.9


def test_a_killed_leader_counts_up_to_its_kill_and_its_restart_is_a_new_process() -> None:
    # a leads, grows 100 -> 140 by minute 5 and is killed at 300 s (after minute 5's sample);
    # restarted as a standby at 200 MB; b takes over with its own flat stretch
    a = [100.0, 110.0, 120.0, 130.0, 140.0, 200.0, 201.0, 202.0, 202.0, 202.0]
    rows = {m: {"rss": {"a": a[m], "b": B[m]}, "leader": LEADERS[m]} for m in range(10)}
    growth = rss_growth(rows, ["a", "b"], {"killed_a": 300}, warmup=2)
    assert round(growth, 1) == round((140 / 120 - 1) * 100, 1), growth  # minutes 3-5 of a


def test_a_minute_a_process_was_down_is_left_out() -> None:
    # down at the last sample (it died without a drill): its growth up to then still counts
    rows = {m: {"rss": {"a": v, "b": 150.0}, "leader": "a"}
            for m, v in enumerate([100.0, 100.0, 100.0, 105.0, 110.0, 0.0])}
    growth = rss_growth(rows, ["a", "b"], {}, warmup=2)
    assert round(growth) == 10, growth


def test_a_restarted_process_is_a_standby_until_a_leader_is_known() -> None:
    # a leads and is killed at 300 s; in the next minute no leader is known: the restarted a
    # (200 -> 230 MB there and after, as a standby) is not a's leading stretch carried on
    a = [100.0, 100.0, 100.0, 100.0, 100.0, 200.0, 210.0, 220.0, 230.0]
    leaders = ["a"] * 5 + [None] + ["b"] * 3
    rows = {m: {"rss": {"a": a[m], "b": 150.0}, "leader": leaders[m]} for m in range(9)}
    growth = rss_growth(rows, ["a", "b"], {"killed_a": 300}, warmup=2)
    assert round(growth, 1) == round((230 / 220 - 1) * 100, 1), growth  # minutes 8-9 of a
