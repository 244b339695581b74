"""Victim selection: who, in which order, and who is protected."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker.domain import Reason
from policies.preemption import Mode, PreemptionParams, select_victims
from policies.types import RunningJob
from tests.unit.policies.builders import at, make_job, q, quota_config, running

QUOTAS = quota_config(
    {
        "vision": ("c", {"h100": q(16)}),
        "language": ("c", {"h100": q(16)}),
        "other": ("d", {"h100": q(16)}),
    }
)
URGENT = make_job().team("vision").priority(1000, preempting=True).build()


@dataclass
class Case:
    id: str
    running: list[RunningJob]
    need: int
    victims: list[str]
    mode: Mode = "priority"
    reason: Reason = Reason.WaitingForPreemption
    in_message: str = ""
    job: object = field(default=URGENT)


CASES = [
    Case("lowest-priority-first", [running("b", priority=100), running("a", priority=0)], 8, ["a"]),
    Case(
        "least-work-lost-since-checkpoint",
        [
            running("old-ckpt", priority=0, checkpoint=-60),
            running("fresh-ckpt", priority=0, checkpoint=-5),
        ],
        8,
        ["fresh-ckpt"],
    ),
    Case(
        "no-checkpoint-counts-from-start",
        [
            running("never", priority=0, started=-30),
            running("ckpt", priority=0, started=-300, checkpoint=-10),
        ],
        8,
        ["ckpt"],
    ),
    Case(
        "equal-priority-is-never-a-victim",
        [running("peer", priority=1000)],
        8,
        [],
        reason=Reason.InsufficientCapacity,
        in_message="only 0 lower-priority GPUs",
    ),
    Case(
        "minimum-runtime-protects",
        [running("young", priority=0, started=-5)],
        8,
        [],
        reason=Reason.InsufficientCapacity,
        in_message="(1 protected)",
    ),
    Case(
        "near-completion-protects",
        [running("finishing", priority=0, end=10)],
        8,
        [],
        reason=Reason.InsufficientCapacity,
        in_message="(1 protected)",
    ),
    Case(
        "unneeded-victims-are-dropped",
        [
            running("small", gpus=4, priority=0, checkpoint=-1),
            running("big", gpus=16, priority=0, checkpoint=-50),
        ],
        16,
        ["big"],
    ),
    Case(
        "other-pool-is-not-considered",
        [running("far", priority=0, pool="p2")],
        8,
        [],
        reason=Reason.InsufficientCapacity,
    ),
    Case(
        "non-preempting-class",
        [running("a", priority=0)],
        8,
        [],
        reason=Reason.InsufficientCapacity,
        in_message="may not preempt",
        job=make_job().priority(1000).build(),
    ),
    Case(
        "reclaim-takes-only-borrowed-cohort-peers",
        [
            running("lang-own", team="language", priority=0),
            running("lang-borrowed", team="language", priority=2000, borrowed=True),
            running("other-cohort", team="other", priority=0, borrowed=True),
            running("mine", team="vision", priority=0, borrowed=True),
        ],
        8,
        ["lang-borrowed"],
        mode="reclaim",
        job=make_job().team("vision").priority(0).build(),
    ),
    Case(
        "team-takes-only-its-own-lower-priority-work-of-the-flavor",
        [
            running("own-low", priority=0, gpus=8),
            running("own-equal", priority=1000),
            running("own-other-flavor", priority=0, flavor="a100"),
            running("other-team-low", team="language", priority=0),
            running("own-mid", priority=100, pool="p2"),
        ],
        16,
        ["own-low", "own-mid"],
        mode="team",
        in_message="preempting 2 job(s)",
    ),
    Case(
        "team-mode-needs-a-preempting-class",
        [running("own-low", priority=0)],
        8,
        [],
        mode="team",
        reason=Reason.InsufficientCapacity,
        in_message="may not preempt",
        job=make_job().priority(1000).build(),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_victims(case: Case) -> None:
    plan = select_victims(
        case.job,
        case.need,
        case.running,
        at(0),
        case.mode,  # type: ignore[arg-type]
        pool="p1",
        flavor="h100",
        quotas=QUOTAS,
    )
    assert [v.job_id for v in plan.victims] == case.victims, plan.message
    assert plan.reason is case.reason
    assert plan.ok == bool(case.victims)
    assert case.in_message in plan.message
    for v in plan.victims:
        assert v.reason is Reason.Preempted and v.grace_seconds == 120


def test_params_change_protection() -> None:
    young = [running("young", priority=0, started=-5)]
    plan = select_victims(
        URGENT, 8, young, at(0), "priority", pool="p1", params=PreemptionParams(min_runtime_s=60)
    )
    assert [v.job_id for v in plan.victims] == ["young"]
    assert plan.victims[0].lost_gpu_hours == pytest.approx(8 * 5 / 60, abs=1e-3)
