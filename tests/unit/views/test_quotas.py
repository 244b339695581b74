"""Quota views (pure): limits, used, borrowed, lent out, waiting demand."""

from __future__ import annotations

from broker.config import IsthmusConfig
from broker.store.reports import QueuedJob
from broker.views.quotas import lent_out, quota_views, waiting_demand
from tests.builders import spec


def test_limits_used_borrowed_and_lent_out(example_config: IsthmusConfig) -> None:
    # vision borrows 16 h100 above its 64; language (nominal 32) uses 8: of the cohort's
    # idle lendable GPUs (vision lends none while over nominal) language lends the 16
    usage = {("vision", "h100-80g"): (80, 16), ("language", "h100-80g"): (8, 0)}
    lines = {(q.team, q.flavor): q for q in quota_views(example_config, usage, {})}
    v, lang = lines[("vision", "h100-80g")], lines[("language", "h100-80g")]
    assert (v.nominal, v.borrowing_limit, v.lending_limit) == (64, 32, 32)
    assert (v.used, v.borrowed, v.lent_out) == (80, 16, 0)
    assert (lang.used, lang.borrowed, lang.lent_out, lang.cohort) == (8, 0, 16, "research")
    assert lines[("vision", "a100-80g")].used == 0


def test_lent_out_shares_borrowing_among_idle_lenders_and_sums_up(
    example_config: IsthmusConfig,
) -> None:
    # a100: vision lends all of its 64 (no lending limit), language at most 16 of its 32
    used = {("vision", "a100-80g"): 0, ("language", "a100-80g"): 40}
    borrowed = {("language", "a100-80g"): 8}
    lent = lent_out(example_config, used, borrowed)
    assert lent.get(("vision", "a100-80g")) == 8
    assert lent.get(("language", "a100-80g"), 0) == 0
    used = {("vision", "a100-80g"): 48, ("language", "a100-80g"): 16}  # idle: 16 and 16
    lent = lent_out(example_config, used, {("vision", "a100-80g"): 0,
                                           ("language", "a100-80g"): 0})
    assert sum(lent.values()) == 0
    borrowed_3 = {("vision", "a100-80g"): 3}
    lent = lent_out(example_config, used, borrowed_3)
    assert sum(lent.values()) == 3 and set(lent.values()) <= {1, 2}


def test_waiting_demand_counts_queued_jobs_in_each_flavor_they_accept(
    example_config: IsthmusConfig,
) -> None:
    both = spec().team("vision").flavors("h100-80g", "a100-80g").build()
    one = spec().team("language").flavors("a100-80g").replicas(1).gpus(4).build()
    jobs = [QueuedJob("j1", "vision", both.gang.total_gpus, both.spec_hash(),
                      both.canonical_json()),
            QueuedJob("j2", "vision", both.gang.total_gpus, both.spec_hash(),
                      both.canonical_json()),
            QueuedJob("j3", "language", 4, one.spec_hash(), one.canonical_json()),
            QueuedJob("j4", "language", 4, "broken", "{not json")]
    demand = waiting_demand(example_config, jobs)
    assert demand == {("vision", "h100-80g"): (2, 32), ("vision", "a100-80g"): (2, 32),
                      ("language", "a100-80g"): (1, 4)}
    lines = quota_views(example_config, {}, demand, team="language")
    assert {q.team for q in lines} == {"language"}
    assert next(q for q in lines if q.flavor == "a100-80g").waiting_gpus == 4
