"""A control plane over two simulated backends (one of each kind) and the steps tests drive it
with: one control cycle, a job's state, a submission, the consistency checks."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from backends.sim.backend import DURATION_ENV, SimBackend, SimClock, SimPoolSpec
from broker import ledger
from broker.config import IsthmusConfig
from broker.control.admission import run_admission
from broker.control.dispatch import run_dispatch
from broker.control.plane import ControlParams, ControlPlane
from broker.control.reconcile import run_reconcile
from broker.orchestration.replay import check_all
from broker.orchestration.submission import submit_job
from broker.store import attempts as att
from broker.store import daily_sums
from broker.store.db import Database
from broker.store.queries import get_job, list_jobs
from tests.builders import SpecBuilder, spec

CONFIG: dict[str, Any] = {
    "auth": {"mode": "none"},
    "flavors": [
        {"name": "h100-80g", "gpu_model": "H100", "gpu_memory_gb": 80, "cost_weight": 2.0},
        {"name": "a100-80g", "gpu_model": "A100", "gpu_memory_gb": 80},
    ],
    # the simulated Slurm runs images (a site with pyxis), as the SimBackends built here do
    "backends": [{"name": "sim-slurm", "kind": "slurm",
                  "settings": {"container": {"runtime": "pyxis"}}},
                 {"name": "sim-k8s", "kind": "k8s"}],
    "pools": [
        {"name": "slurm-h100", "backend": "sim-slurm", "flavor": "h100-80g",
         "capacity": {"nodes": 4, "gpus_per_node": 8, "nodes_per_rack": 2}},
        {"name": "k8s-a100", "backend": "sim-k8s", "flavor": "a100-80g",
         "capacity": {"nodes": 8, "gpus_per_node": 8, "nodes_per_rack": 4}},
    ],
    "cohorts": [{"name": "research"}],
    "teams": [
        {"name": "vision", "cohort": "research",
         "quotas": {"h100-80g": {"nominal": 32}, "a100-80g": {"nominal": 64}}},
        {"name": "language", "cohort": "research",
         "quotas": {"h100-80g": {"nominal": 0, "borrowing_limit": 16},
                    "a100-80g": {"nominal": 16}}},
    ],
}


class Sim:
    def __init__(self, plane: ControlPlane, clock: SimClock,
                 backends: dict[str, SimBackend]) -> None:
        self.plane, self.clock, self.backends = plane, clock, backends

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for b in self.backends.values():
            b.sync()  # process each backend up to the shared clock



def cycle(sim: Sim, seconds: float = 10) -> None:
    run_admission(sim.plane)
    run_dispatch(sim.plane)
    sim.advance(seconds)
    for name in sim.backends:
        run_reconcile(sim.plane, name)


def state(sim: Sim, job_id: str) -> tuple[str, str]:
    with sim.plane.db.read() as s:
        job = get_job(s, job_id)
        assert job is not None
        return job.state, job.reason


def consistent(sim: Sim) -> None:
    """Replay matches rows, ledger counters and daily sums match entries, the GPUs reserved
    equal the GPUs of the jobs that hold a reservation (ADMITTED, PREPARING, RUNNING), and no
    job has two live attempts (a reconcile chunk relies on it: reconcile_apply._write_locked)."""
    with sim.plane.db.read() as s:
        assert list(check_all(s)) == []
        live = Counter(a.job_id for a in att.live(s))
        assert [j for j, n in live.items() if n > 1] == []
        assert ledger.check(s) == []
        assert daily_sums.mismatches(s) == []
        holding = list_jobs(s, states=["ADMITTED", "PREPARING", "RUNNING"], limit=10_000)
        reserved = sum(g for (g, _) in ledger.usage(s).values())
        assert reserved == sum(j.total_gpus for j in holding)


def submit(sim: Sim, builder: SpecBuilder, duration: float = 60) -> str:
    s = builder.build()
    s = s.model_copy(update={"env": {**s.env, DURATION_ENV: str(duration)}})
    return submit_job(sim.plane.db, sim.plane.config, s, "tester").job.id


def attempts_of(sim: Sim, job_id: str) -> list[att.AttemptRecord]:
    with sim.plane.db.read() as s:
        return att.attempts_of(s, job_id)


def run_until(sim: Sim, job_id: str, wanted: str, cycles: int = 30, step: float = 10) -> None:
    for _ in range(cycles):
        if state(sim, job_id)[0] == wanted:
            return
        cycle(sim, step)
    raise AssertionError(f"job stayed {state(sim, job_id)}, wanted {wanted}")


def make_sim(db: Database, config: IsthmusConfig) -> Sim:
    """A control plane on `db` over two simulated backends (one of each kind), as `sim`."""
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    backends = {
        "sim-slurm": SimBackend(
            "sim-slurm", "slurm",
            [SimPoolSpec("slurm-h100", "h100-80g", racks_per_block=2, nodes_per_rack=2)],
            clock, seed=1,
        ),
        "sim-k8s": SimBackend(
            "sim-k8s", "k8s",
            [SimPoolSpec("k8s-a100", "a100-80g", racks_per_block=2, nodes_per_rack=4)],
            clock, seed=2,
        ),
    }
    # the simulated time is the database's too: budget periods roll over by it
    plane = ControlPlane(db, config, backends, clock=lambda: clock.now,
                         period_clock=lambda _conn: clock.now,
                         params=ControlParams(lost_grace_s=60))
    return Sim(plane, clock, backends)


def mixed_backlog(sim: Sim) -> tuple[list[str], list[str]]:
    """Jobs that one admission cycle admits: two teams, two flavors, both backends, several per
    quota counter (returned first); and two big gangs that wait, with a new reason, because
    the h100 pool has one free node left (returned second)."""
    builders = [
        *(spec().name(f"small-{i}").flavors("a100-80g").replicas(1).gpus(2).topology(None)
          .backend("k8s") for i in range(6)),
        *(spec().name(f"h100-{i}").flavors("h100-80g").replicas(1).gpus(8).topology(None)
          for i in range(3)),
        *(spec().name(f"lang-{i}").team("language").flavors("a100-80g").replicas(2).gpus(8)
          .topology(None) for i in range(3)),
    ]
    waiting = [spec().name(f"big-{i}").flavors("h100-80g").replicas(4).gpus(8).topology(None)
               for i in range(2)]
    return [submit(sim, b, 600) for b in builders], [submit(sim, b, 600) for b in waiting]
