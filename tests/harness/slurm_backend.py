"""The Slurm backend on the real local cluster, as its tests build and watch it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.base import Backend, SubmitRequest
from backends.slurm import SlurmBackend
from broker.config import Backend as BackendConfig
from broker.config import Pool
from broker.domain.attempts import Placement, RunSnapshot, backend_object_name
from broker.domain.facts import Fact, Phase
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from broker.wiring.adapters import slurm_adapter
from tests.fixtures.slurm import SlurmCluster
from tests.harness.wait import wait_until

POOLS = [
    Pool(name="slurm-a100", backend="slurm-local", partition="a100", flavor="a100-80g"),
    Pool(name="slurm-h100", backend="slurm-local", partition="h100", flavor="h100-80g"),
]
ENV_PROBE = ("import os; print('ENV|' + '|'.join(os.environ[k] for k in ('NODE_RANK', "
             "'MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'FOO', 'SLURMD_NODENAME')))")


def make_backend(cluster: SlurmCluster, transport: str) -> SlurmBackend:
    work = cluster.work_dir / "isthmus"
    work.mkdir(exist_ok=True)
    settings: dict[str, Any] = {"transport": transport, "work_dir": str(work),
                                "python": "/usr/bin/python3", "rack_features": True,
                                "timeout": 30}
    if transport == "cli":
        settings["slurm_conf"] = str(cluster.slurm_conf)
    else:
        settings.update(rest_url=cluster.rest_url, rest_user=cluster.jwt_user,
                        rest_token=cluster.jwt)
    config = BackendConfig(name="slurm-local", kind="slurm", settings=settings)
    return slurm_adapter(config, POOLS)


class Jobs:
    """Submits requests with fresh names and cancels them all at the end."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def request(self, entry: dict[str, Any], *, pool: str = "slurm-a100", replicas: int = 2,
                level: str | None = None, domain: str | None = None, grace: int = 30,
                job_id: str | None = None) -> SubmitRequest:
        job_id = job_id or new_job_id()
        spec = JobSpec.model_validate({
            "name": "contract", "team": "vision", "flavors": ["a100-80g"],
            "gang": {"replicas": replicas, "gpus_per_replica": 8}, "entrypoint": entry,
            "env": {"FOO": "bar baz"}, "max_runtime": "10m", "checkpoint": {"grace": grace},
        })
        name = backend_object_name(job_id, 1)
        self.names.append(name)
        placement = Placement(backend="slurm", backend_instance="slurm-local", pool=pool,
                              flavor="a100-80g", topology_level=level, topology_domain=domain)
        return SubmitRequest(job_id=job_id, attempt=1, name=name,
                             snapshot=RunSnapshot.of(spec), placement=placement)

    def cleanup(self) -> None:
        if not self.names:
            return
        out = self.cluster.run(["squeue", "-h", "-o", "%i %j"]).stdout
        ids = [line.split()[0] for line in out.splitlines()
               if line.split() and line.split()[-1] in self.names]
        if ids:
            self.cluster.run(["scancel", *ids], check=False)


def fact_for(backend: Backend, name: str) -> Fact:
    facts = [f for f in backend.observe([name]) if f.backend_name == name]
    assert len(facts) == 1, facts
    return facts[0]


def wait_fact(backend: Backend, name: str, phases: set[Phase], timeout: float = 60) -> Fact:
    def probe() -> Fact | None:
        fact = fact_for(backend, name)
        return fact if fact.phase in phases else None

    return wait_until(probe, timeout=timeout, interval=1, what=f"{name} in {phases}")


def output_of(backend: SlurmBackend, name: str, job_id: str) -> str:
    path = Path(backend.settings.work_dir) / f"{name}-{job_id}.out"
    return wait_until(lambda: path.read_text() if path.exists() else None, timeout=60,
                      what=f"output {path}")


def free_a100(cluster: SlurmCluster) -> None:
    """Tests that need the partition's capacity wait for other work there to finish."""
    def idle() -> bool:
        out = cluster.run(["squeue", "-h", "-p", "a100", "-t", "PD,R,CG,CF", "-o", "%i"]).stdout
        return not out.strip()

    wait_until(idle, timeout=120, interval=1, what="partition a100 idle")
