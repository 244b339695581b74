"""Accuracy of the first estimated start of each job (issue 13 benchmark; not a timed test).

Replays the Helios-shaped trace of bench/placement_quality.py (backends/sim/trace.py) on the
same two simulated backends with the isthmus admission cycle. Each cycle also runs the queue
estimate (policies/eta.py) exactly as the broker's admission does; the first estimate a job
gets (the cycle after its submission) is kept and compared with when the simulator really
starts it. The estimate knows only what the broker knows: the backends' expected releases
and the jobs' declared time limits (over-estimates, trace.py), scaled as the broker scales them
(by the median true/declared run time of the last 200 ended jobs); never true run times.

Error of a job: |first estimate - real start| / real wait, over jobs that waited at least
`--min-wait` seconds (a job that starts in the next cycle has no wait to be wrong about);
jobs whose first estimate is "unknown" are counted apart. Last line:
`eta: median error <X>% p90 <Y>% over <N> jobs`. Jobs admitted in their first cycle get no
estimate (they never wait in Isthmus's queue; what they wait in the backend is the backend's)
and are counted apart.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from datetime import datetime

from backends.base import SubmitRequest
from backends.sim import DURATION_ENV, SimBackend, SimClock
from bench.placement_quality import (
    CYCLE_S,
    FLAVORS,
    T0,
    TEAMS,
    capacity_gpus,
    limit_s,
    make_trace,
    pools,
    snapshot,
)
from broker.domain.inventory import InventorySnapshot
from broker.domain.spec import TopologyLevel
from policies import eta
from policies.admission import AdmissionParams, admission_cycle
from policies.placement import PlacementParams
from policies.types import FlavorQuota, PendingJob, QuotaConfig, TeamQuota, Usage, decay_usage


@dataclass
class Result:
    first: dict[str, datetime | None] = field(default_factory=dict)
    method: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)
    """The decision reason of the cycle that gave the first estimate."""
    started: dict[str, float] = field(default_factory=dict)


def replay(n: int, seed: int, load: float, learn: bool,
           fixed: float | None = None) -> tuple[Result, dict[str, float]]:
    trace = make_trace(n, seed, load)
    nominal = capacity_gpus()
    quotas = QuotaConfig(
        teams={t: TeamQuota(t, "all", {f: FlavorQuota(nominal) for f in FLAVORS}) for t in TEAMS},
        flavor_cost={"h100": 2.0, "a100": 1.0},
    )
    params = AdmissionParams(placement=PlacementParams(default_max_isthmus_pending=0))
    clock = SimClock(T0)
    backends = {
        "slurm-a": SimBackend("slurm-a", "slurm", pools("slurm"), clock, seed=seed),
        "k8s-a": SimBackend("k8s-a", "k8s", pools("k8s"), clock, seed=seed + 1),
    }
    by_id = {j.id: j for j in trace}
    pending: dict[str, PendingJob] = {}
    running: dict[str, tuple[str, str, int]] = {}
    in_use: dict[tuple[str, str], int] = {}
    decayed: dict[tuple[str, str], float] = {}
    res = Result()
    ratios: list[float] = []  # true / declared run time of ended jobs: what the broker sees
    nxt = 0
    stop = trace[-1].submit_s + 14 * 86400
    while (nxt < len(trace) or pending or running) and clock.t < stop:
        while nxt < len(trace) and trace[nxt].submit_s <= clock.t:
            j = trace[nxt]
            nxt += 1
            pending[j.id] = PendingJob(
                id=j.id, team=j.team, replicas=j.replicas, gpus_per_replica=j.gpus_per_replica,
                flavors=j.flavors, submitted_at=clock.at(j.submit_s), priority=j.priority,
                max_runtime_s=limit_s(j),
                topology_required=TopologyLevel.RACK if j.rack_required else None,
            )
        if pending:
            inv = InventorySnapshot(
                taken_at=clock.now,
                pools=tuple(p for b in backends.values() for p in b.inventory().pools),
            )
            usage = Usage(in_use=dict(in_use), decayed=dict(decayed))
            result = admission_cycle(list(pending.values()), inv, quotas, usage, clock.now,
                                     params)
            factor = fixed if fixed is not None else (
                statistics.median(ratios[-200:]) if learn and len(ratios) >= 20 else 1.0)
            estimates = eta.estimate(result.decisions, pending, inv, clock.now,
                                     runtime_factor=factor)
            reasons = {d.job_id: d.reason.value for d in result.decisions}
            for job_id, e in estimates.items():
                if job_id not in res.first:
                    res.first[job_id] = e.at
                    res.method[job_id] = e.method
                    res.reason[job_id] = reasons.get(job_id, "")
            for d in result.admitted():
                assert d.placement is not None
                job, tj = pending.pop(d.job_id), by_id[d.job_id]
                res.first.setdefault(d.job_id, clock.now)
                res.method.setdefault(d.job_id, "admitted")
                req = SubmitRequest(
                    job_id=d.job_id, attempt=1, name=f"isthmus-{d.job_id}-1",
                    snapshot=snapshot(tj), placement=d.placement,
                    env={DURATION_ENV: f"{tj.duration_s:.1f}"},
                )
                backends[d.placement.backend_instance].submit(req)
                running[req.name] = (job.team, d.placement.flavor, job.total_gpus)
                key = (job.team, d.placement.flavor)
                in_use[key] = in_use.get(key, 0) + job.total_gpus
        clock.advance(CYCLE_S)
        for b in backends.values():
            b.sync()
            for bname, kind in b.drain_events():
                job_id = bname.split("-")[1]
                if kind == "start":
                    fact = b.lookup(bname)
                    assert fact is not None and fact.started_at is not None
                    res.started[job_id] = (fact.started_at - T0).total_seconds()
                else:
                    team, flavor, gpus = running.pop(bname)
                    in_use[(team, flavor)] -= gpus
                    tj = by_id[job_id]
                    ratios.append(tj.duration_s / limit_s(tj))
        for key in set(in_use) | set(decayed):
            decayed[key] = decay_usage(decayed.get(key, 0.0), in_use.get(key, 0), CYCLE_S, 6 * 3600)
    return res, {j.id: j.submit_s for j in trace}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--min-wait", type=float, default=600.0,
                    help="only jobs that really waited this many seconds are scored")
    ap.add_argument("--declared", action="store_true",
                    help="trust declared limits; by default they are scaled by the median "
                         "true/declared run time of ended jobs, as the broker does "
                         "(broker.control.admission.runtime_factor)")
    ap.add_argument("--factor", type=float, default=None,
                    help="a fixed run-time factor instead of the learnt one")
    args = ap.parse_args()
    res, submitted = replay(args.jobs, args.seed, args.load, not args.declared, args.factor)
    errors: list[float] = []
    signed: list[float] = []
    unknown = 0
    waited = 0
    methods: dict[str, int] = {}
    now_reasons: dict[str, int] = {}
    for job_id, start in res.started.items():
        wait = start - submitted[job_id]
        if wait < args.min_wait:
            continue
        waited += 1
        first = res.first.get(job_id)
        m = res.method.get(job_id, "none").split(":")[0].split(" ")[0]
        methods[m] = methods.get(m, 0) + 1
        if m == "now":  # "starts now" yet waited: why the cycle did not admit it
            r = res.reason.get(job_id, "")
            now_reasons[r] = now_reasons.get(r, 0) + 1
        if m == "admitted":
            continue  # admitted in its first cycle: it never waited in Isthmus's queue
        if first is None:
            unknown += 1
            continue
        est = (first - T0).total_seconds()
        errors.append(abs(est - start) / wait)
        signed.append((est - start) / wait)
    print(f"trace: {args.jobs} jobs, seed {args.seed}, load {args.load:.0%}; "
          f"{len(res.started)} started, {waited} waited >= {args.min_wait:.0f}s")
    print(f"first-estimate methods of those: {dict(sorted(methods.items()))}; "
          f"{unknown} without an estimate")
    if now_reasons:
        print("estimated 'now' yet waited, by the cycle's reason: "
              f"{dict(sorted(now_reasons.items()))}")
    if signed:
        late = sum(1 for x in signed if x > 0) / len(signed)
        print(f"estimate later than the real start for {late:.0%} of them; "
              f"median signed error {statistics.median(signed):+.0%}")
    print(f"eta: median error {pct(errors, 0.5):.0%} p90 {pct(errors, 0.9):.0%} "
          f"over {len(errors)} jobs")


if __name__ == "__main__":
    main()
