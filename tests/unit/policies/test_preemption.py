"""Victim selection: who, in which order, and who is protected."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from broker.domain import Reason
from policies.preemption import Mode, PreemptionParams, PreemptionPlan, select_victims
from policies.types import PendingJob, RunningJob
from tests.unit.policies.builders import (
    PoolBuilder,
    at,
    make_job,
    make_pool,
    q,
    quota_config,
    room,
    running,
)

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
    job: PendingJob = field(default=URGENT)


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
    # governance: another team's job within its nominal quota is guaranteed
    Case("another-teams-guaranteed-job-is-no-victim",
         [running("theirs", team="language", priority=0)], 8, [],
         reason=Reason.InsufficientCapacity,
         in_message="1 guaranteed: other teams' jobs within their nominal quota"),
    Case("another-teams-borrowed-job-is-a-victim",
         [running("theirs", team="language", priority=0, borrowed=True)], 8, ["theirs"]),
    Case("own-team-lower-priority-before-nothing",
         [running("theirs", team="language", priority=0), running("ours", priority=0)], 8,
         ["ours"]),
    Case("a-class-that-may-preempt-across-teams-stops-a-guaranteed-job",
         [running("theirs", team="language", priority=0)], 8, ["theirs"],
         job=make_job().team("vision").priority(1000, preempting=True)
         ._set(preempts_across_teams=True).build()),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_victims(case: Case) -> None:
    plan = select_victims(
        case.job,
        case.need,
        case.running,
        at(0),
        case.mode,
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


# ---- topology-aware priority preemption ---------------------------------------------------
# Pools are full unless `free` says otherwise; default shape: one block, racks b0/r00
# (p1-n0..n3) and b0/r01 (p1-n4..n7) of 8-GPU nodes. Work lost grows with the checkpoint age.


def rack_gang() -> PendingJob:
    return make_job().gpus(8).replicas(2).topology("rack").priority(1000, True).build()


def one_node_job() -> PendingJob:
    return make_job().gpus(8).priority(1000, True).build()


def low(id: str, *nodes: str, ckpt: float = -10, gpus: int = 8) -> RunningJob:
    return running(id, priority=0, gpus=gpus, checkpoint=ckpt, nodes=nodes)


def high(id: str, *nodes: str, gpus: int = 8) -> RunningJob:
    return running(id, priority=1000, gpus=gpus, nodes=nodes)


@dataclass
class RoomCase:
    id: str
    job: PendingJob
    running: list[RunningJob]
    victims: list[str]
    pool: PoolBuilder = field(default_factory=make_pool)
    free: dict[str, int] = field(default_factory=dict)
    need: int = 0
    """The pool's GPU shortfall admission passes (0 when free GPUs are only fragmented)."""
    domain: str | None = None
    exclude: tuple[str, ...] = ()
    in_message: str = ""


ROOM_CASES = [
    RoomCase(
        "rack-gang-takes-exactly-enough-victims-from-one-rack",
        rack_gang(),
        [
            low("a", "n0", ckpt=-10),
            low("c", "n4", ckpt=-20),
            low("b", "n1", ckpt=-30),
            low("d", "n5", ckpt=-40),
            *(high(f"h{n}", f"n{n}") for n in (2, 3, 6, 7)),
        ],
        ["a", "b"],  # counting GPUs alone would stop a and c, one per rack: useless
        need=16,
        domain="b0/r00",
        in_message="preempting 2 job(s) (a, b) to free 16 GPUs in b0/r00",
    ),
    RoomCase(
        "the-rack-losing-least-work-wins-not-the-cheapest-first-victim",
        rack_gang(),
        [
            low("a", "n0", ckpt=-5),
            low("c", "n4", ckpt=-10),
            low("d", "n5", ckpt=-15),
            low("b", "n1", ckpt=-100),
            *(high(f"h{n}", f"n{n}") for n in (2, 3, 6, 7)),
        ],
        ["c", "d"],
        need=16,
        domain="b0/r01",
    ),
    RoomCase(
        "fragmented-free-gpus-one-half-node-victim-completes-a-node",
        one_node_job(),
        [
            low("x", "n0", gpus=4, ckpt=-10),
            low("y", "n1", gpus=4, ckpt=-20),
            low("z", "n2", ckpt=-30),
            low("w", "n3", ckpt=-60),
        ],
        ["x"],
        pool=make_pool().shape(1, 1, 4),
        free={"p1-n0": 4, "p1-n1": 4},
        need=0,
        domain="",
        in_message="in the pool",
    ),
    RoomCase(
        "two-halves-of-one-node-and-the-useless-third-is-dropped",
        one_node_job(),
        [
            low("a", "n0", gpus=4, ckpt=-10),
            low("c", "n1", gpus=4, ckpt=-15),
            low("b", "n0", gpus=4, ckpt=-20),
            high("h", "n1", gpus=4),
        ],
        ["a", "b"],
        pool=make_pool().shape(1, 1, 2),
        need=8,
    ),
    RoomCase(
        "victims-whose-end-would-not-make-the-gang-fit-are-never-chosen",
        rack_gang(),
        [low("a", "n0"), low("b", "n4"), *(high(f"h{n}", f"n{n}") for n in (1, 2, 3, 5, 6, 7))],
        [],
        need=16,
        in_message="preemption would not help: stopping lower-priority work (2 job(s) "
        "preemptible) leaves no room for 2 x 8 GPUs within one rack",
    ),
    RoomCase(
        "a-victim-spanning-two-racks-frees-neither",
        rack_gang(),
        [
            running("span", priority=0, gpus=16, checkpoint=-1, nodes=("n3", "n4")),
            low("a", "n0"),
            low("b", "n1"),
            *(high(f"h{n}", f"n{n}") for n in (2, 5, 6, 7)),
        ],
        ["a", "b"],
        need=16,
    ),
    RoomCase(
        "gpus-freed-on-an-excluded-node-do-not-count",
        one_node_job(),
        [low("a", "n0", ckpt=-1), low("b", "n1", ckpt=-50)],
        ["b"],
        pool=make_pool().shape(1, 1, 2),
        need=8,
        exclude=("p1-n0",),
    ),
    RoomCase(
        "gpus-freed-on-an-unschedulable-node-do-not-count",
        one_node_job(),
        [low("a", "n0", ckpt=-1), low("b", "n1", ckpt=-50)],
        ["b"],
        pool=make_pool().shape(1, 1, 2).down_("p1-n0"),
        need=8,
    ),
    RoomCase(
        "a-protected-victim-where-it-would-help-means-no-preemption",
        one_node_job(),
        [running("young", priority=0, started=-5, nodes=("n0",))],
        [],
        pool=make_pool().shape(1, 1, 1),
        need=8,
        in_message="preemption would not help: no lower-priority job can be preempted "
        "(1 protected)",
    ),
    RoomCase(
        "victims-without-a-node-list-fall-back-to-counting-gpus",
        rack_gang(),
        [low("old-a"), low("old-b")],
        ["old-a", "old-b"],
        need=16,
    ),
    RoomCase(
        "no-fallback-when-the-pool-has-the-gpus-but-they-are-fragmented",
        one_node_job(),
        [low("old-a")],
        [],
        pool=make_pool().shape(1, 1, 2),
        free={"p1-n0": 4, "p1-n1": 4},
        need=0,
    ),
]


def _room_plan(case: RoomCase, jobs: list[RunningJob]) -> PreemptionPlan:
    level = case.job.topology_required
    return select_victims(
        case.job,
        case.need,
        jobs,
        at(0),
        "priority",
        pool="p1",
        flavor="h100",
        quotas=QUOTAS,
        room=room(
            case.pool.use_all_but(case.free), level.value if level else None, case.exclude
        ),
    )


@pytest.mark.parametrize("case", ROOM_CASES, ids=[c.id for c in ROOM_CASES])
def test_topology_aware_victims(case: RoomCase) -> None:
    plan = _room_plan(case, case.running)
    assert [v.job_id for v in plan.victims] == case.victims, plan.message
    assert plan.ok == bool(case.victims)
    want = Reason.WaitingForPreemption if case.victims else Reason.InsufficientCapacity
    assert plan.reason is want
    if case.domain is not None:
        assert plan.domain == case.domain
    assert case.in_message in plan.message


@pytest.mark.parametrize("case", ROOM_CASES, ids=[c.id for c in ROOM_CASES])
def test_topology_aware_victims_do_not_depend_on_input_order(case: RoomCase) -> None:
    first = _room_plan(case, case.running)
    for seed in range(10):
        jobs = list(case.running)
        random.Random(seed).shuffle(jobs)
        assert _room_plan(case, jobs) == first


def test_a_victim_without_a_checkpoint_is_told_its_whole_run_is_lost() -> None:
    never = select_victims(URGENT, 8, [running("a", priority=0, started=-3600)], at(0),
                           "priority", pool="p1", flavor="h100", quotas=QUOTAS)
    assert "since it started (no checkpoint)" in never.victims[0].message
    saved = select_victims(URGENT, 8, [running("a", priority=0, checkpoint=-60)], at(0),
                           "priority", pool="p1", flavor="h100", quotas=QUOTAS)
    assert "since the last checkpoint" in saved.victims[0].message


@pytest.mark.parametrize(("value", "shown"), [(0.0, "0.0"), (0.04, "0.04"), (0.004, "<0.01"),
                                               (0.12, "0.1"), (12.34, "12.3")])
def test_small_gpu_hours_are_not_shown_as_nothing(value: float, shown: str) -> None:
    from broker.cli.output import hours

    assert hours(value) == shown


def test_the_preempting_team_is_not_told_another_teams_victim() -> None:
    """Reclaim stops another team's borrowed job: the waiting job's message (its status and
    events, which its team reads) names what is freed, not whose job it is."""
    theirs = running("theirs", team="language", priority=0, borrowed=True)
    plan = select_victims(URGENT, 8, [theirs, running("ours", priority=0)], at(0), "priority",
                          pool="p1", flavor="h100", quotas=QUOTAS)
    assert plan.ok and {v.job_id for v in plan.victims} <= {"theirs", "ours"}
    if any(v.job_id == "theirs" for v in plan.victims):
        assert "theirs" not in plan.message and "a job of another team" in plan.message
    reclaim = select_victims(URGENT, 8, [theirs], at(0), "reclaim", pool="p1",
                             flavor="h100", quotas=QUOTAS)
    assert [v.job_id for v in reclaim.victims] == ["theirs"]
    assert "theirs" not in reclaim.message and "a job of another team" in reclaim.message


def test_the_decisions_route_masks_another_teams_victim() -> None:
    from broker.api.routes_views import _masked
    from broker.views.decisions import VictimView

    v = VictimView(job_id="06h46b", team="language", pool="p1", gpus=8, reason="Preempted")
    assert _masked(v, "language") == v
    hidden = _masked(v, "vision")
    assert (hidden.job_id, hidden.team, hidden.gpus) == ("a job of another team",
                                                         "another team", 8)
