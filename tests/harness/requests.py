"""Submit requests as the dispatcher builds them, for the Slurm script and the simulator."""

from __future__ import annotations

from backends.base import SubmitRequest
from backends.sim import DURATION_ENV
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import BackendKind, JobSpec, TopologyLevel
from tests.builders import spec


def slurm_request(
    entry: dict[str, object] | None = None,
    *,
    level: str | None = None,
    domain: str | None = None,
    nodes: tuple[str, ...] = (),
    **spec: object,
) -> SubmitRequest:
    data: dict[str, object] = {
        "name": "train", "team": "vision", "gang": {"replicas": 2, "gpus_per_replica": 8},
        "flavors": ["a100-80g"], "entrypoint": entry or {"command": ["python", "train.py"]},
        "max_runtime": "90m", "checkpoint": {"grace": 45}, **spec,
    }
    placement = Placement(backend="slurm", backend_instance="slurm-local", pool="slurm-a100",
                          flavor="a100-80g", topology_level=level, topology_domain=domain,
                          nodes=nodes)
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=2, name="isthmus-01abcdefghjkmnpq-2",
                         snapshot=RunSnapshot.of(JobSpec.model_validate(data)),
                         placement=placement, env={"ISTHMUS_PROGRESS_TOKEN": "t0k"})


def sim_request(
    n: int,
    replicas: int = 1,
    gpus: int = 8,
    nodes: tuple[str, ...] = (),
    duration: float | None = 600,
    level: TopologyLevel | None = None,
    max_runtime: int | None = None,
) -> SubmitRequest:
    b = spec().replicas(replicas).gpus(gpus)
    s = (b.set("max_runtime", max_runtime) if max_runtime is not None else b).build()
    env = {DURATION_ENV: str(duration)} if duration is not None else {}
    placement = Placement(
        backend=BackendKind.SLURM,
        backend_instance="sim-a",
        pool="p1",
        flavor="h100",
        nodes=nodes,
        topology_level=level,
    )
    return SubmitRequest(
        job_id=f"j{n}",
        attempt=1,
        name=f"isthmus-j{n}-1",
        snapshot=RunSnapshot.of(s),
        placement=placement,
        env=env,
    )
