"""Synthetic job traces shaped like public GPU cluster traces (Helios, Philly).

What those traces show, and what is reproduced here: most jobs ask for one GPU, a few percent
are large multi-node gangs that hold most of the GPU-hours; run times are heavy-tailed
(log-normal body with minutes-long medians and multi-day tails); arrivals are bursty. The
numbers below are rounded shapes, not fitted values: the aim is a workload with the same
pressure points (many small jobs fragmenting nodes, a few big gangs needing whole racks).

Each job also declares a time limit (max_runtime), as users do on batch clusters: an
over-estimate rounded up to a familiar value, and now and then simply the cluster maximum
(studies of user run-time estimates, e.g. Tsafrir et al. 2007, find a few modal values and
most jobs using a small fraction of their limit). Limits come from their own random stream, so
adding them did not change the jobs, arrivals or run times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

ROUND_LIMITS_S: tuple[float, ...] = tuple(
    h * 3600.0 for h in (0.5, 1, 2, 4, 8, 12, 24, 48, 72)
)
MAX_LIMIT_SHARE = 0.15
"""Share of jobs that declare the largest limit whatever they need."""

# (GPUs, share of jobs): Helios/Philly report ~60-70% single-GPU jobs and <5% above 8 GPUs.
SIZE_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.62),
    (2, 0.08),
    (4, 0.09),
    (8, 0.13),
    (16, 0.04),
    (32, 0.025),
    (64, 0.012),
    (128, 0.003),
)


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    team: str
    submit_s: float
    replicas: int
    gpus_per_replica: int
    duration_s: float
    flavors: tuple[str, ...]
    rack_required: bool
    priority: int = 100
    limit_s: float | None = None
    """Declared time limit (what the scheduler knows); never below `duration_s`."""

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


def gpu_cluster_trace(
    n_jobs: int,
    teams: list[str],
    flavors: list[str],
    *,
    seed: int = 0,
    mean_interarrival_s: float = 60.0,
    node_gpus: int = 8,
    median_duration_s: float = 1200.0,
    sigma: float = 1.6,
    max_duration_s: float = 3 * 86400.0,
    max_gpus: int = 128,
) -> list[TraceJob]:
    """`n_jobs` jobs with Poisson-burst arrivals, the size mix above and log-normal run times.
    Teams are Zipf-skewed (a few heavy users); a job accepts its preferred flavor and, half
    of the time, one fallback. Gangs of 2+ nodes require a rack."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not secrets
    limits = random.Random(f"limits-{seed}")  # noqa: S311 - its own stream, see module doc
    sizes = [s for s, _ in SIZE_MIX if s <= max_gpus]
    weights = [w for s, w in SIZE_MIX if s <= max_gpus]
    team_w = [1.0 / (i + 1) for i in range(len(teams))]
    mu = math.log(median_duration_s)
    out: list[TraceJob] = []
    t = 0.0
    for i in range(n_jobs):
        # bursts: one arrival in ten opens a burst of closely spaced submissions
        gap = rng.expovariate(1.0 / mean_interarrival_s)
        t += gap * (0.1 if rng.random() < 0.5 and i % 10 else 1.0)
        gpus = rng.choices(sizes, weights)[0]
        if gpus > node_gpus:
            replicas, per = gpus // node_gpus, node_gpus
        else:
            replicas, per = 1, gpus
        # big gangs run longer: a log-normal shifted up with size
        dur = rng.lognormvariate(mu + 0.25 * math.log2(gpus), sigma)
        dur = min(max(dur, 30.0), max_duration_s)
        team = rng.choices(teams, team_w)[0]
        first = flavors[hash_index(team, len(flavors))]
        fl = [first]
        if len(flavors) > 1 and rng.random() < 0.5:
            fl.append(rng.choice([f for f in flavors if f != first]))
        out.append(
            TraceJob(
                id=f"t{i:06d}",
                team=team,
                submit_s=t,
                replicas=replicas,
                gpus_per_replica=per,
                duration_s=dur,
                flavors=tuple(fl),
                rack_required=replicas > 1,
                limit_s=declared_limit(dur, limits),
            )
        )
    return out


def declared_limit(duration_s: float, rng: random.Random) -> float:
    """A user's time limit for a job that will run `duration_s`: the largest round value for
    MAX_LIMIT_SHARE of jobs, else 1 to 3 times the run time rounded up to a round value."""
    if rng.random() < MAX_LIMIT_SHARE:
        return max(ROUND_LIMITS_S[-1], duration_s)
    want = duration_s * rng.uniform(1.0, 3.0)
    return next((r for r in ROUND_LIMITS_S if r >= want), max(ROUND_LIMITS_S[-1], duration_s))


def hash_index(name: str, n: int) -> int:
    """A stable (not salted) index for `name`: Python's hash() changes between runs."""
    return sum(name.encode()) % n
