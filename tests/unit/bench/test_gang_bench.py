"""bench/gang_bench.py's pure parts: knavigator's gang-scheduling workload and the metrics
computed from a pod timeline (issue 30)."""

from __future__ import annotations

import pytest

from bench.gang_bench import (
    GROUPS,
    NODES,
    OPTIMUM_S,
    PodRun,
    free_wait,
    idle_split,
    makespan,
    occupancy,
    phase_split,
    split_gangs,
    workload,
)


def test_the_workload_is_knavigators_53_gangs_each_group_filling_the_32_nodes() -> None:
    gangs = workload()
    assert len(gangs) == 53
    assert NODES == 32
    assert [sum(g) for g in GROUPS] == [32] * 9
    assert OPTIMUM_S == 270
    # the order of run-test.yaml, group by group
    assert gangs[:8] == [32, 16, 16, 10, 10, 10, 2, 8]
    assert gangs[-10:] == [3] * 9 + [5]
    assert sorted(set(gangs)) == [1, 2, 3, 4, 5, 6, 8, 10, 16, 32]


def test_the_optimal_schedule_scores_270_s_at_full_occupancy() -> None:
    """Every group as one 30 s wave on all 32 nodes, back to back."""
    runs, t = [], 100.0
    g = 0
    for group in GROUPS:
        node = 0
        for replicas in group:
            for _ in range(replicas):
                runs.append(PodRun(g, f"n{node}", t, t, t + 30))
                node += 1
            g += 1
        t += 30
    assert makespan(100.0, runs) == pytest.approx(270.0)
    assert occupancy(runs, NODES, 100.0, 370.0) == pytest.approx(1.0)


def test_makespan_and_occupancy_of_a_hand_made_timeline() -> None:
    # 2 nodes; gang 0 on both for [1, 11]; gang 1 on node a for [13, 23]; first submit at 0
    runs = [PodRun(0, "a", 1, 1, 11), PodRun(0, "b", 1, 1, 11), PodRun(1, "a", 12.5, 13, 23)]
    span = makespan(0.0, runs)
    assert span == pytest.approx(23.0)
    # 30 node-seconds of running pods over 2 nodes x 23 s (bound -> running is not work)
    assert occupancy(runs, 2, 0.0, span) == pytest.approx(30 / 46)
    # clipped to the window asked for
    assert occupancy(runs, 2, 5.0, 10.0) == pytest.approx(1.0)


def test_free_wait_counts_only_the_time_enough_nodes_were_free() -> None:
    # gang 1 (1 replica) submitted at 0; both nodes taken by gang 0 until 11 (bound at 1: free
    # 0-1), then its pod is bound at 12.5 and runs at 13
    runs = [PodRun(0, "a", 1, 1, 11), PodRun(0, "b", 1, 1.5, 11), PodRun(1, "a", 12.5, 13, 23)]
    w = free_wait(1, 1, 0.0, runs, 2)
    assert w.started == 13
    assert w.with_free_nodes == pytest.approx(1.0 + 2.0)  # [0, 1] and [11, 13]
    assert w.ready == 11
    # a gang of 2 had no free stretch while one node was taken
    runs2 = [PodRun(0, "a", 0, 0, 10), PodRun(0, "b", 0, 0, 5),
             PodRun(1, "a", 10.5, 11, 20), PodRun(1, "b", 10.5, 11, 20)]
    w2 = free_wait(1, 2, 0.0, runs2, 2)
    assert w2.with_free_nodes == pytest.approx(1.0)  # [10, 11] only, not [5, 10]
    assert w2.ready == 10


def test_a_gangs_own_running_pods_do_not_count_against_it() -> None:
    # gang 1 (2 replicas): one pod runs at 2, the other only at 6, both nodes free from 0
    runs = [PodRun(1, "a", 2, 2, 20), PodRun(1, "b", 5, 6, 20)]
    w = free_wait(1, 2, 0.0, runs, 2)
    assert w.started == 6
    assert w.with_free_nodes == pytest.approx(6.0)
    assert w.ready == 0.0


def test_phase_split_sums_to_the_stretch_and_clamps_the_marks() -> None:
    parts = phase_split(10.0, 12.0, [10.5, 11.0, None, 11.5, 12.0])
    assert parts == pytest.approx([0.5, 0.5, 0.0, 0.5, 0.5])
    # admitted before the nodes were free counts nothing; a late mark is cut at the start
    parts = phase_split(10.0, 12.0, [8.0, 9.0, 10.2, 13.0, 12.0])
    assert parts == pytest.approx([0.0, 0.0, 0.2, 1.8, 0.0])
    assert sum(phase_split(3.0, 7.5, [None, 4.0, 4.0, 6.0, None])) == pytest.approx(4.5)


def test_idle_node_time_splits_into_latency_and_packing() -> None:
    # 2 nodes over [0, 20]: gang 0 (2 pods) runs [1, 10] on both, gang 1 (2 pods, submitted
    # at 0) runs [12, 20] on both
    runs = [PodRun(0, "a", 0.5, 1, 10), PodRun(0, "b", 0.5, 1, 10),
            PodRun(1, "a", 11, 12, 20), PodRun(1, "b", 11, 12, 20)]
    latency, packing = idle_split(runs, [2, 2], [0.0, 0.0], [1.0, 12.0], 2, 0.0, 20.0)
    # [0, 1]: 2 idle nodes, gang 0 waits and fits; [10, 12]: 2 idle, gang 1 fits
    assert latency == pytest.approx(2 * 1 + 2 * 2)
    assert packing == pytest.approx(0.0)
    # a gang of 3 on 2 nodes never fits: idle time while it waits is packing
    runs3 = [PodRun(0, "a", 0, 0, 10)]
    latency, packing = idle_split(runs3, [1, 3], [0.0, 0.0], [0.0, 30.0], 2, 0.0, 10.0)
    assert [latency, packing] == pytest.approx([0.0, 10.0])
    # one node idle while a 1-pod gang waits [0, 4] then starts on it: latency 4, then
    # nothing waits: the tail [4, 6] on node b is packing
    runs4 = [PodRun(0, "a", 0, 0, 6), PodRun(1, "b", 4, 4, 5)]
    latency, packing = idle_split(runs4, [1, 1], [0.0, 0.0], [0.0, 4.0], 2, 0.0, 6.0)
    assert [latency, packing] == pytest.approx([4.0, 1.0])
    # a gang partly running needs only its missing pods' nodes: [0, 6] on node b is latency
    runs5 = [PodRun(0, "c", 0, 0, 10), PodRun(1, "a", 0, 0, 10), PodRun(1, "b", 6, 6, 10)]
    latency, packing = idle_split(runs5, [1, 2], [0.0, 0.0], [0.0, 6.0], 3, 0.0, 10.0)
    assert [latency, packing] == pytest.approx([6.0, 0.0])


def test_a_gang_whose_pods_started_apart_is_reported() -> None:
    runs = [PodRun(0, "a", 0, 0, 30), PodRun(0, "b", 0, 4.9, 35),
            PodRun(1, "c", 0, 1, 31), PodRun(1, "d", 20, 31, 61)]
    assert split_gangs(runs) == [1]
