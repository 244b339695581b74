"""bench/vs_kueue_perf.py, its pure parts: Kueue's generator.yaml read as Kueue's generator
makes the objects (names, counts, arrival times), the Isthmus configuration made from it, the
metrics computed as Kueue's runner does on a hand-made timeline, and Kueue's output read as
its checker reads it. No run, no timing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from backends.sim.backend import DURATION_ENV
from bench import vs_kueue_perf as vkp

# the shape of Kueue v0.17.0's configs/baseline/generator.yaml
BASELINE = """
cohorts:
  - className: cohort
    count: 5
    queuesSets:
    - className: cq
      count: 6
      nominalQuota: 20
      borrowingLimit: 100
      reclaimWithinCohort: Any
      withinClusterQueue: LowerPriority
      workloadsSets:
      - count: 350
        creationIntervalMs: 100
        workloads:
        - className: small
          runtimeMs: 200
          priority: 50
          request: 1
      - count: 100
        creationIntervalMs: 500
        workloads:
        - className: medium
          runtimeMs: 500
          priority: 100
          request: 5
      - count: 50
        creationIntervalMs: 1200
        workloads:
        - className: large
          runtimeMs: 1000
          priority: 200
          request: 20
"""


def test_baseline_gives_15000_workloads_in_30_queues_of_5_cohorts() -> None:
    gen = vkp.parse_generator(BASELINE)
    assert gen.cohorts == tuple(f"cohort-{i}" for i in range(5))
    assert len(gen.queues) == 30
    assert len(gen.workloads) == 15_000
    assert Counter(w.cls for w in gen.workloads) == {"small": 10_500, "medium": 3_000,
                                                     "large": 1_500}
    assert Counter(w.queue for w in gen.workloads) == {q.name: 500 for q in gen.queues}
    q = gen.queues[0]
    assert (q.name, q.cohort, q.cls, q.nominal, q.borrowing_limit) == \
        ("cq-0-0-cohort-0", "cohort-0", "cq", 20, 100)
    assert (q.reclaim_within_cohort, q.within_cluster_queue) == ("Any", "LowerPriority")
    assert gen.priorities == (50, 100, 200)
    # the work: 10,500 x 1 x 0.2 + 3,000 x 5 x 0.5 + 1,500 x 20 x 1 unit-seconds
    assert sum(w.request * w.runtime_s for w in gen.workloads) == pytest.approx(39_600)


def test_arrivals_follow_the_generator_one_interval_before_each_create() -> None:
    gen = vkp.parse_generator(BASELINE)
    mine = {w.name: w for w in gen.workloads if w.queue == "cq-0-3-cohort-2"}
    assert mine["small-0-0-0"].arrival_s == pytest.approx(0.1)
    assert mine["small-0-349-0"].arrival_s == pytest.approx(35.0)
    assert mine["medium-1-0-0"].arrival_s == pytest.approx(0.5)
    assert mine["large-2-49-0"].arrival_s == pytest.approx(60.0)
    large = mine["large-2-7-0"]
    assert (large.request, large.runtime_s, large.priority) == (20, 1.0, 200)
    assert max(w.arrival_s for w in gen.workloads) == pytest.approx(60.0)


def test_several_templates_in_a_set_alternate_and_each_waits_an_interval() -> None:
    gen = vkp.parse_generator("""
cohorts:
- className: c
  count: 1
  queuesSets:
  - className: q
    count: 1
    nominalQuota: "4"
    reclaimWithinCohort: Any
    withinClusterQueue: Never
    workloadsSets:
    - count: 2
      creationIntervalMs: 10
      workloads:
      - {className: a, runtimeMs: 5, priority: 1, request: 1}
      - {className: b, runtimeMs: 5, priority: 2, request: "2"}
""")
    assert [w.name for w in gen.workloads] == ["a-0-0-0", "b-0-0-1", "a-0-1-0", "b-0-1-1"]
    assert [w.arrival_s for w in gen.workloads] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert gen.queues[0].borrowing_limit is None
    assert [w.request for w in gen.workloads] == [1, 2, 1, 2]


def test_what_has_no_meaning_here_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one cohort"):
        vkp.parse_generator("cohorts: []")
    with pytest.raises(ValueError, match="whole number"):
        vkp.parse_generator(BASELINE.replace("request: 5", "request: 500m"))
    with pytest.raises(ValueError, match="TAS"):
        vkp.parse_generator("topology: {name: t}\n" + BASELINE)


def test_the_isthmus_configuration_mirrors_the_queues() -> None:
    gen = vkp.parse_generator(BASELINE)
    cfg = vkp.isthmus_config(gen, nodes=90, gpus_per_node=20)
    assert [c.name for c in cfg.cohorts] == list(gen.cohorts)
    team = next(t for t in cfg.teams if t.name == "cq-0-5-cohort-4")
    assert team.cohort == "cohort-4"
    quota = team.quotas[vkp.FLAVOR]
    assert (quota.nominal, quota.borrowing_limit) == (20, 100)
    assert {(p.name, p.value, p.preempting, p.preempt_across_teams)
            for p in cfg.priority_classes} == {("p50", 50, True, False),
                                               ("p100", 100, True, False),
                                               ("p200", 200, True, False)}
    assert cfg.pools[0].capacity is not None
    assert cfg.pools[0].capacity.nodes * cfg.pools[0].capacity.gpus_per_node == 1800
    # Isthmus's own protection windows unless asked; 0 as in Kueue's test when asked
    assert cfg.policies.preemption.min_runtime == 600
    bare = vkp.isthmus_config(gen, 90, 20, protection_s=0)
    assert (bare.policies.preemption.min_runtime, bare.policies.preemption.protect_near_end) \
        == (0, 0)
    with pytest.raises(ValueError, match="does not fit"):
        vkp.isthmus_config(gen, 90, 8)
    with pytest.raises(ValueError, match="reclaimWithinCohort"):
        vkp.isthmus_config(vkp.parse_generator(BASELINE.replace(": Any", ": LowerPriority")),
                           90, 20)


def test_a_workload_becomes_a_one_replica_job_of_its_class_and_runtime() -> None:
    w = vkp.Workload("medium-1-0-0", "cq-0-0-cohort-0", "medium", 5, 0.5, 100, 0.5)
    spec = vkp.job_spec(w)
    assert (spec.team, spec.priority, spec.gang.replicas, spec.gang.gpus_per_replica) == \
        ("cq-0-0-cohort-0", "p100", 1, 5)
    assert spec.env[DURATION_ENV] == "0.5"


def test_holds_from_events_cover_each_admission_until_it_leaves_the_holding_states() -> None:
    events = [("SUBMITTED", 0.0), ("QUEUED", 0.0), ("ADMITTED", 2.0), ("PREPARING", 2.1),
              ("RUNNING", 2.2), ("RETRYING", 3.0), ("QUEUED", 3.0), ("ADMITTED", 5.0),
              ("PREPARING", 5.1), ("RUNNING", 5.2), ("SUCCEEDED", 6.0)]
    holds, finished = vkp.holds_from_events(events)
    assert holds == [(2.0, 3.0), (5.0, 6.0)]
    assert finished == 6.0
    assert vkp.holds_from_events([("QUEUED", 1.0)]) == ([], None)


def test_metrics_on_a_hand_made_timeline() -> None:
    # two queues of nominal 10 and 30; the run starts at 100 and the last finish is at 110
    tls = [
        vkp.Timeline("small", "qa", 2, created=100.0, holds=[(101.0, 103.0)], finished=103.0),
        vkp.Timeline("small", "qb", 1, created=101.0, holds=[(105.0, 110.0)], finished=110.0),
        # admitted twice: time to admission counts to the last admission (Kueue's recorder)
        vkp.Timeline("large", "qb", 20, created=100.0, holds=[(102.0, 104.0), (106.0, 108.0)],
                     finished=108.0),
    ]
    m = vkp.metrics(tls, {"qa": 10, "qb": 30}, start=100.0)
    assert m.wall_s == pytest.approx(10.0)
    # used: qa 2 x 2 = 4; qb 1 x 5 + 20 x 2 + 20 x 2 = 85; quota 40 x 10 s
    assert m.usage_pct == pytest.approx(100 * 89 / 400)
    assert m.min_usage_pct == pytest.approx(100 * 4 / 100)
    assert m.admission_s == {"small": pytest.approx((1.0 + 4.0) / 2),
                             "large": pytest.approx(6.0)}
    assert m.counts == {"small": 2, "large": 1}
    assert m.unfinished == 0


def test_an_unfinished_workload_is_counted_and_its_hold_cut_at_the_last_finish() -> None:
    tls = [vkp.Timeline("small", "qa", 1, 0.0, [(0.0, 4.0)], 4.0),
           vkp.Timeline("small", "qa", 2, 0.0, [(1.0, float("inf"))], None),
           vkp.Timeline("large", "qa", 5, 0.0, [], None)]
    m = vkp.metrics(tls, {"qa": 4}, start=0.0)
    assert m.wall_s == 4.0
    assert m.usage_pct == pytest.approx(100 * (4 + 2 * 3) / 16)
    assert m.unfinished == 2
    assert m.admission_s["large"] == 0.0  # never admitted: 0, as the recorder's zero value
    with pytest.raises(ValueError):
        vkp.metrics([], {"qa": 1}, start=0.0)


def test_kueue_output_is_read_as_its_checker_reads_it(tmp_path: Path) -> None:
    (tmp_path / "summary.yaml").write_text("""clusterQueueClasses:
  cq:
    cpuAverageUsage: 30000
    cpuUsed: 12000000
    firstEventTime: "2026-12-05T13:52:54Z"
    lastEventTime: "2026-12-05T13:52:56Z"
    nominalQuota: 40000
droppedWorkloadEvents: 0
workloadClasses:
  large:
    averageTimeToAdmissionMs: 1500
    averageTimeToFinishMs: 2500
    count: 2
    totalEvictions: 0
  small:
    averageTimeToAdmissionMs: 250
    averageTimeToFinishMs: 450
    count: 8
    totalEvictions: 1
""")
    (tmp_path / "minimalkueue.stats.yaml").write_text(
        "maxrss: 1\nsysMs: 500\nuserMs: 2000\nwallMs: 7250\n")
    (tmp_path / "cqStates.csv").write_text(
        "name,cohort,class name,CPU quota (mCPU),CPU used (mCPU * ms),CPU max usage (mCPU),"
        "monitor time (ms)\n"
        "cq-a,c,cq,20000,8000000,20000,2000\n"
        "cq-b,c,cq,20000,4000000,20000,2000\n")
    k = vkp.read_kueue(tmp_path)
    assert k.wall_s == pytest.approx(7.25)
    # 12,000,000 mCPU*ms / (40,000 mCPU x 2,000 ms)
    assert k.usage_pct == pytest.approx(15.0)
    assert k.min_usage_pct == pytest.approx(10.0)
    assert k.admission_s == {"large": 1.5, "small": 0.25}
    assert (k.user_s, k.sys_s) == (2.0, 0.5)


def test_the_last_line_has_every_figure_in_the_issue_s_order() -> None:
    k = vkp.KueueResult(400.0, 57.4, 53.0, {"large": 18.4, "medium": 99.6, "small": 235.2},
                        {}, 0.0, 0.0, 0)
    i = vkp.Metrics(100.0, 60.0, 55.0, {"large": 1.0, "medium": 2.0, "small": 3.0}, {}, 0)
    assert vkp.last_line(k, i) == (
        "kueue-perf: kueue 400.0 s isthmus 100.0 s ratio 4.00 usage kueue 57.4% isthmus 60.0% "
        "admission large/medium/small kueue 18.4 99.6 235.2 s isthmus 1.0 2.0 3.0 s")
    assert vkp.last_line(None, i).startswith("kueue-perf: kueue - s isthmus 100.0 s ratio - ")
