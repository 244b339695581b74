"""Accuracy of the first estimated start of each job (issue 13 benchmark; not a timed test).

Replays the Helios-shaped trace of bench/placement_quality.py (backends/sim/trace.py) on the
same two simulated backends with the isthmus admission cycle. Each cycle also runs the queue
estimate (policies/eta.py) exactly as the broker's admission does; the first estimate a job
gets (the cycle after its submission) is kept and compared with when the simulator really
starts it. The estimate knows only what the broker knows: the backends' expected releases,
the jobs' declared time limits (over-estimates, trace.py), the run-time model learnt from the
last 1,000 ended jobs (team, declared limit, GPUs, true run; policies/run_length.py), and its
running jobs' nodes, starts and limits (broker/control/eta_inputs.py); never a job's true run time
before it ended, nor jobs not yet submitted.

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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

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
from broker.control.eta_inputs import RATIO_SAMPLES
from broker.domain.inventory import InventorySnapshot
from broker.domain.topology import TopologyLevel
from policies import eta
from policies.cycle import AdmissionParams, Decision, admission_cycle
from policies.placement import PlacementParams
from policies.run_length import RunSample, RuntimeModel
from policies.types import FlavorQuota, PendingJob, QuotaConfig, TeamQuota, Usage, decay_usage


@dataclass
class Result:
    first: dict[str, datetime | None] = field(default_factory=dict)
    method: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)
    """The decision reason of the cycle that gave the first estimate."""
    started: dict[str, float] = field(default_factory=dict)


HISTORY = RATIO_SAMPLES
"""Ended jobs the run-time model learns from (the most recent), as the broker keeps them."""
ONE_RATIO = (200, 20)
"""`--runtimes ratio`: the median true/declared ratio of the last 200 ended jobs, 1.0 until 20
have ended (the broker's run-time factor before the model)."""


def _running(backends: dict[str, SimBackend], running: dict[str, tuple[str, str, int]],
             model: RuntimeModel, now: float) -> list[eta.Running]:
    """What the broker knows of its running attempts: nodes, start and declared limit; their
    predicted end comes from the model, given how long they have run."""
    out: list[eta.Running] = []
    for b in backends.values():
        for name in running:
            job = b.jobs.get(name)
            if job is None or job.started is None or job.limit is None:
                continue
            team = running[name][0]
            elapsed = now - job.started
            end = now + model.remaining_s(team, job.limit, elapsed, running[name][2])
            for node in set(job.nodes):
                out.append(eta.Running(node, T0 + timedelta(seconds=job.started + job.limit),
                                       T0 + timedelta(seconds=end)))
    return out


def replay(n: int, seed: int, load: float, mode: str,
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
    # ended jobs' team, declared and true run time: what the broker sees
    history: deque[RunSample] = deque(maxlen=HISTORY)
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
            if all(j in res.first for j in pending):
                estimates = {}  # only first estimates are scored: nothing new to estimate
            else:
                estimates = _estimate(mode, fixed, history, result.decisions, pending, inv,
                                      backends, running, clock.t)
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
                    history.append(RunSample(tj.team, limit_s(tj), tj.duration_s, tj.gpus))
        for key in set(in_use) | set(decayed):
            decayed[key] = decay_usage(decayed.get(key, 0.0), in_use.get(key, 0), CYCLE_S, 6 * 3600)
    return res, {j.id: j.submit_s for j in trace}


def _estimate(mode: str, fixed: float | None, history: deque[RunSample],
              decisions: Sequence[Decision], pending: dict[str, PendingJob],
              inv: InventorySnapshot, backends: dict[str, SimBackend],
              running: dict[str, tuple[str, str, int]], t: float) -> dict[str, eta.Estimate]:
    now = T0 + timedelta(seconds=t)
    if mode == "declared" or fixed is not None:
        return eta.estimate(decisions, pending, inv, now, runtime_factor=fixed or 1.0)
    recent = list(history)[-ONE_RATIO[0]:]
    factor = (statistics.median(s.ran_s / s.declared_s for s in recent)
              if len(recent) >= ONE_RATIO[1] else 1.0)
    if mode == "ratio":  # one ratio for every job (the estimate before the model)
        return eta.estimate(decisions, pending, inv, now, runtime_factor=factor)
    model = RuntimeModel.learn(history)
    known = _running(backends, running, model, t) if mode == "model" else []
    return eta.estimate(decisions, pending, inv, now, runtime_factor=model.factor(),
                        model=model, running=known)


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
    ap.add_argument("--runtimes", default="model",
                    choices=("model", "model-no-running", "ratio", "declared"),
                    help="model (default, as the broker does): run times predicted from ended "
                         "jobs of the same declared limit and team (policies/run_length.py); "
                         "model-no-running: the same, but running work's ends from its "
                         "releases scaled by the median ratio, not from its start and limit; "
                         "ratio: declared limits scaled by one median true/declared ratio; "
                         "declared: declared limits as they are")
    ap.add_argument("--factor", type=float, default=None,
                    help="a fixed run-time factor instead of the learnt one")
    args = ap.parse_args()
    res, submitted = replay(args.jobs, args.seed, args.load, args.runtimes, args.factor)
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
