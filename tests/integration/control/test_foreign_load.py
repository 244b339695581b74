"""Queue depth that includes foreign load, on the simulator: of two pools a gang fits in, the
one whose backend queue holds a long backlog of jobs that are not Isthmus's loses."""

from __future__ import annotations

from datetime import UTC, datetime

from backends.sim.backend import SimBackend, SimClock, SimPoolSpec
from broker.config import parse_config
from broker.control.admission import run_admission
from broker.control.plane import ControlPlane
from broker.orchestration.submission import submit_job
from broker.store import Database
from broker.store import attempts as att
from tests.builders import spec

CONFIG = {
    "auth": {"mode": "none"},
    "flavors": [{"name": "h100-80g", "gpu_model": "H100", "gpu_memory_gb": 80}],
    "backends": [{"name": "sim-slurm", "kind": "slurm",  # runs images, as the sim does
                  "settings": {"container": {"runtime": "pyxis"}}}],
    "pools": [
        {"name": name, "backend": "sim-slurm", "flavor": "h100-80g",
         "capacity": {"nodes": 4, "gpus_per_node": 8, "nodes_per_rack": 2}}
        for name in ("a-busy", "b-idle")
    ],
    "teams": [{"name": "vision", "quotas": {"h100-80g": {"nominal": 64}}}],
}


def _placed(db: Database, foreign_gpus: int) -> str:
    clock = SimClock(datetime(2026, 11, 29, tzinfo=UTC))
    backend = SimBackend("sim-slurm", "slurm", [
        SimPoolSpec(name, "h100-80g", racks_per_block=2, nodes_per_rack=2)
        for name in ("a-busy", "b-idle")
    ], clock, seed=1)
    if foreign_gpus:  # a foreign job too large to start: it waits in a-busy's queue for good
        backend.enqueue(backend.foreign_job("a-busy", foreign_gpus // 8, 8, 3600.0, None))
    config = parse_config(CONFIG)
    plane = ControlPlane(db, config, {"sim-slurm": backend}, clock=lambda: clock.now)
    inventory = {p.name: p for p in plane.inventory().pools}
    assert inventory["a-busy"].queue.foreign_pending_gpus == foreign_gpus
    assert inventory["a-busy"].free_gpus == inventory["b-idle"].free_gpus == 32
    job = submit_job(db, config, spec().team("vision").flavors("h100-80g").build(), "t").job
    assert run_admission(plane).record.admitted == 1
    with db.read() as s:
        [attempt] = att.attempts_of(s, job.id)
    return attempt.pool


def test_a_foreign_backlog_sends_the_gang_to_the_other_fitting_pool(db: Database) -> None:
    assert _placed(db, 0) == "a-busy"  # equal pools: the tie goes by name
    assert _placed(db, 64) == "b-idle"
