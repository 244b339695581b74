"""When a Slurm node's busy GPUs are expected back: running jobs' start + time limit (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from backends.slurm.inventory import SlurmPoolBinding, node_releases, pool_snapshots, queue_depth
from backends.slurm.records import NodeRecord, SlurmJob

T0 = datetime(2026, 11, 29, 10, tzinfo=UTC)


def job(i: int, nodes: tuple[str, ...], gpus: int, *, limit: int | None = 3600,
        state: str = "RUNNING", user: str = "someone") -> SlurmJob:
    return SlurmJob(job_id=str(i), name=f"j{i}", state=state, nodes=nodes, partition="a100",
                     gpus=gpus, user=user, started_at=T0 if state == "RUNNING" else None,
                     time_limit_s=limit)


def test_running_jobs_release_their_gpus_per_node_at_start_plus_limit() -> None:
    got = node_releases([
        job(1, ("n1", "n2"), 16),  # a gang: 8 per node
        job(2, ("n1",), 4, limit=600),
        job(3, ("n3",), 8, limit=None),  # UNLIMITED: no known end
        job(4, (), 8, state="PENDING"),
        job(5, ("n3",), 0),  # no GPUs
    ])
    assert got == {
        "n1": [(T0 + timedelta(hours=1), 8), (T0 + timedelta(minutes=10), 4)],
        "n2": [(T0 + timedelta(hours=1), 8)],
    }


def test_snapshots_carry_releases_sorted_and_none_on_unusable_nodes() -> None:
    nodes = [NodeRecord("n1", ("a100",), "mixed", gpus=8, gpus_used=8),
             NodeRecord("n2", ("a100",), "mixed", frozenset({"DRAIN"}), "maintenance",
                        gpus=8, gpus_used=8)]
    jobs = [job(1, ("n1", "n2"), 12), job(2, ("n1",), 2, limit=600)]
    (pool,) = pool_snapshots("slurm", [SlurmPoolBinding("a100", "a100", "a100-80g")], nodes, [],
                             jobs, T0)
    by_name = {n.name: n for n in pool.nodes}
    assert by_name["n1"].releases == ((T0 + timedelta(minutes=10), 2),
                                      (T0 + timedelta(hours=1), 6))
    assert by_name["n2"].releases == ()


def test_an_absurd_time_limit_saturates_instead_of_overflowing() -> None:
    from broker.domain.timebox import FAR_FUTURE

    got = node_releases([job(1, ("n1",), 8, limit=10**12 * 60)])
    assert got == {"n1": [(FAR_FUTURE.replace(tzinfo=UTC), 8)]}


def test_foreign_backlog_counts_waiting_work_but_not_held_or_never_runnable_jobs() -> None:
    def pending(i: int, gpus: int, reason: str, name: str = "train") -> SlurmJob:
        return SlurmJob(job_id=str(i), name=name, state="PENDING", partition="a100",
                         gpus=gpus, reason=reason)

    depth = queue_depth("a100", [
        pending(1, 8, "Resources"), pending(2, 4, "Priority"), pending(3, 2, "Dependency"),
        pending(4, 16, "JobHeldUser"), pending(5, 16, "BeginTime"),
        pending(6, 16, "DependencyNeverSatisfied"), pending(7, 16, "PartitionTimeLimit"),
        pending(8, 8, "Resources", name="isthmus-abc-1"),
    ], 24, T0)
    assert (depth.foreign_pending_gpus, depth.isthmus_pending_gpus) == (14, 8)


def test_never_runnable_jobs_of_isthmus_and_of_several_partitions_still_count() -> None:
    def pending(i: int, gpus: int, reason: str, name: str = "train",
                partition: str = "a100") -> SlurmJob:
        return SlurmJob(job_id=str(i), name=name, state="PENDING", partition=partition,
                         gpus=gpus, reason=reason)

    jobs = [
        # Isthmus's own: it holds a place in the queue (the pool's pending limit counts it)
        pending(1, 8, "PartitionTimeLimit", name="isthmus-abc-1"),
        # two partitions, a reason from one of them: it may still run in the other
        pending(2, 4, "PartitionTimeLimit", partition="a100,h100"),
        # a reason about the job itself: it never runs anywhere
        pending(3, 16, "DependencyNeverSatisfied", partition="a100,h100"),
        pending(4, 16, "PartitionNodeLimit"),  # one partition: never runs there
    ]
    a100 = queue_depth("a100", jobs, 24, T0)
    assert (a100.isthmus_pending_gpus, a100.isthmus_pending_jobs) == (8, 1)
    assert a100.foreign_pending_gpus == 4
    h100 = queue_depth("h100", jobs, 24, T0)
    assert (h100.isthmus_pending_gpus, h100.foreign_pending_gpus) == (0, 4)
