"""A team queue's share of its team's quota (policies/queue_share.py): the cap per flavor is
floor(share x (nominal + what the team may borrow)); admission counts what the queue holds and
what the cycle admitted, refuses the flavor past the cap with QueueShareReached, and the team's
other queues go on admitting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.domain import Reason
from policies.cycle import admission_cycle
from policies.preemption import Preemptor
from policies.queue_share import cap, reach
from policies.types import PendingJob, QuotaConfig, Usage
from tests.unit.policies.builders import (
    at,
    inventory,
    make_job,
    make_pool,
    q,
    quota_config,
    running,
)


@pytest.mark.parametrize(("teams", "expected"), [
    ({"vision": (None, {"h100": q(32)})}, 32),
    ({"vision": ("c", {"h100": q(32)}), "language": ("c", {"h100": q(16)})}, 48),
    ({"vision": ("c", {"h100": q(32, borrow=4)}), "language": ("c", {"h100": q(16)})}, 36),
    ({"vision": ("c", {"h100": q(32)}), "language": ("c", {"h100": q(16, lend=6)})}, 38),
    ({"vision": ("c", {"h100": q(32)}), "language": ("other", {"h100": q(16)})}, 32),
    # no quota line for the flavor: borrowing limit 0, as the quota check has it
    ({"vision": ("c", {"a100": q(8)}), "language": ("c", {"h100": q(16)})}, 0),
], ids=["no-cohort", "cohort-lends", "borrowing-limit", "lending-limit", "other-cohort",
        "no-quota-line"])
def test_a_teams_reach_is_nominal_plus_what_it_may_borrow(
        teams: dict[str, tuple[str | None, dict[str, object]]], expected: int) -> None:
    assert reach(quota_config(teams), "vision", "h100") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("share", "team_reach", "expected"), [
    (0.5, 32, 16), (0.29, 100, 29), (0.3, 10, 3), (1.0, 7, 7), (0.1, 5, 0),
], ids=["half", "no-float-drift", "floor", "whole", "below-one-gpu"])
def test_the_cap_is_the_floor_of_share_times_reach(share: float, team_reach: int,
                                                   expected: int) -> None:
    assert cap(share, team_reach) == expected


def _quotas(shares: dict[str, float]) -> QuotaConfig:
    base = quota_config({"vision": (None, {"h100": q(32), "a100": q(32)})})
    team = replace(base.teams["vision"], queue_weights={"research": 1.0, "prod": 1.0},
                   queue_shares=shares)
    return replace(base, teams={"vision": team})


SHARED = _quotas({"research": 0.5})
POOLS = inventory(make_pool("p1").shape(1, 2, 4), make_pool("p2").flavor_("a100").shape(1, 2, 4))


def _job(name: str, queue: str, minutes: float, *flavors: str) -> PendingJob:
    return replace(make_job().id(name).gpus(8).flavors(*(flavors or ("h100",)))
                   .submitted(minutes).build(), queue=queue)


def _decide(jobs: list[PendingJob], use: Usage | None = None,
            quotas: QuotaConfig = SHARED) -> dict[str, tuple[bool, Reason, str]]:
    res = admission_cycle(jobs, POOLS, quotas, use or Usage(), at(0))
    return {d.job_id: (d.admitted, d.reason, d.message) for d in res.decisions}


def test_the_cap_counts_the_cycles_admissions_and_other_queues_go_on() -> None:
    jobs = [_job(f"r{i}", "research", -30 + i) for i in range(3)] + [_job("p", "prod", -1)]
    d = _decide(jobs)
    assert [d[j][0] for j in ("r0", "r1", "r2", "p")] == [True, True, False, True], d
    assert d["r2"][1] is Reason.QueueShareReached, d["r2"]
    assert ("queue research holds 16 of the 16 h100 GPUs its share allows (50% of the 32 h100 "
            "GPUs team vision may hold (nominal 32, borrowable 0)) and needs 8 more") \
        in d["r2"][2], d["r2"]
    # without the share the third research job is admitted: room and quota allow it
    assert _decide(jobs, quotas=_quotas({}))["r2"][0]


def test_the_cap_counts_what_the_queue_holds() -> None:
    held = Usage(in_use={("vision", "h100"): 16},
                 queue_flavor_gpus={("vision", "research", "h100"): 16})
    d = _decide([_job("r", "research", -30), _job("p", "prod", -1)], held)
    assert d["r"][:2] == (False, Reason.QueueShareReached) and d["p"][0], d
    # what another queue holds, or another flavor, does not count against research's h100
    other = Usage(in_use={("vision", "h100"): 16, ("vision", "a100"): 16},
                  queue_flavor_gpus={("vision", "prod", "h100"): 16,
                                     ("vision", "research", "a100"): 16})
    assert _decide([_job("r", "research", -30)], other)["r"][0]


def test_a_queue_at_its_cap_in_one_flavor_takes_another() -> None:
    held = Usage(in_use={("vision", "h100"): 16},
                 queue_flavor_gpus={("vision", "research", "h100"): 16})
    res = admission_cycle([_job("r", "research", -30, "h100", "a100")], POOLS, SHARED, held,
                          at(0))
    (dec,) = res.decisions
    assert dec.admitted and dec.placement is not None and dec.placement.flavor == "a100"


def test_a_queue_at_its_cap_preempts_nothing_of_its_team() -> None:
    """A preempting job past its queue's share is not helped by stopping its team's jobs."""
    held = Usage(in_use={("vision", "h100"): 32},
                 queue_flavor_gpus={("vision", "research", "h100"): 16,
                                    ("vision", "prod", "h100"): 16})
    urgent = replace(_job("r", "research", -1), priority=1000, can_preempt=True)
    victims = [running(f"v{i}", priority=0, nodes=(f"n{i}",)) for i in range(4)]
    pre = Preemptor(victims, SHARED, at(0))
    (dec,) = admission_cycle([urgent], POOLS, SHARED, held, at(0), preemptor=pre).decisions
    assert (dec.admitted, dec.reason, dec.victims) == (False, Reason.QueueShareReached, ()), dec
