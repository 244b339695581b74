"""A team's queues in admission order (policies/ordering.py): within a priority level the
queue holding the fewest GPUs per unit of weight goes next, but a higher priority or a
starving gang at the head of an over-served queue still goes first."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from policies.ordering import OrderingParams, admission_order
from policies.types import PendingJob, QuotaConfig, TeamQuota, Usage
from tests.unit.policies.builders import T0

QUOTAS = QuotaConfig(teams={"vision": TeamQuota(
    name="vision", queue_weights={"research": 1.0, "prod": 3.0})})
# research holds 24 GPUs (24 per unit of weight), prod nothing: prod is under-served
HELD = Usage(queue_gpus={("vision", "research"): 24})


def _job(name: str, queue: str, minutes: int, **kw: Any) -> PendingJob:
    return replace(PendingJob(id=name, team="vision", queue=queue, replicas=1,
                              gpus_per_replica=8, flavors=("h100",),
                              submitted_at=T0 + timedelta(minutes=minutes)), **kw)


def _order(jobs: list[PendingJob], **kw: object) -> list[str]:
    return [j.id for j in admission_order(jobs, QUOTAS, HELD, **kw)]  # type: ignore[arg-type]


def test_the_under_served_queue_goes_first_at_one_priority() -> None:
    jobs = [_job("r-old", "research", 0), _job("p-new", "prod", 5)]
    assert _order(jobs) == ["p-new", "r-old"]


def test_a_higher_priority_head_goes_first_from_the_over_served_queue() -> None:
    jobs = [_job("r-urgent", "research", 5, priority=100), _job("p", "prod", 0)]
    assert _order(jobs) == ["r-urgent", "p"]


def test_a_starving_gang_goes_first_from_the_over_served_queue() -> None:
    params = OrderingParams(starvation_after_s=600, reservation_min_gpus=32)
    gang = _job("r-gang", "research", 0, replicas=4)
    jobs = [gang, _job("p", "prod", 50)]
    now = T0 + timedelta(minutes=60)
    assert _order(jobs, now=now, params=params) == ["r-gang", "p"]
    # not yet starving: the under-served queue first
    assert _order(jobs, now=T0 + timedelta(minutes=5), params=params) == ["p", "r-gang"]
