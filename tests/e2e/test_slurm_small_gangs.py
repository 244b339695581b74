"""Small gangs through the server on the real Slurm cluster: admission packs them onto one node
and the Slurm backend runs them there (they used to go ADMITTED -> QUEUED DispatchRefused ->
PoolExcluded and wait for ever)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.harness.server import ROOT, Server, job_spec, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
# every rank leaves a file named after its rank, its node and the GPUs it saw
PROBE = ["/bin/sh", "-c", 'touch "$ISTHMUS_JOB_DIR/rank-$RANK-$SLURMD_NODENAME-'
         '$(echo $CUDA_VISIBLE_DEVICES | tr , _)"']


def _events(server: Server, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/events", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_small_gangs_run_packed_on_one_node(slurm_cluster: object, tmp_path: Path,
                                            workdir: Path) -> None:
    cfg = write_config(tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)],
                       slurm_pools())
    example = yaml.safe_load((ROOT / "examples/jobs/sbatch-style.yaml").read_text())
    # the shipped example as it is (2 x 4 GPUs, backend slurm), with a command that exists here
    example["entrypoint"] = {"command": PROBE}
    specs = [example,
             job_spec("four-by-two", "a100-80g", replicas=4, gpus=2, command=PROBE,
                      backend="slurm")]
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        ids = [server.submit(spec)["id"] for spec in specs]

        def ended() -> bool:
            return all(server.job(i)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                       for i in ids)

        wait_until(ended, 300, "both gangs to end", interval=1)
        for job_id, spec in zip(ids, specs, strict=True):
            job = server.job(job_id)
            events = _events(server, job_id)
            assert job["state"] == "SUCCEEDED", (job, events)
            assert not [e for e in events if e["reason"] in ("DispatchRefused", "PoolExcluded")]
            replicas = spec["gang"]["replicas"]
            ranks = sorted(p.name for p in workdir.rglob("rank-*")
                           if p.parent.name.startswith(f"isthmus-{job_id}"))
            assert [r.split("-")[1] for r in ranks] == [str(i) for i in range(replicas)], ranks
            assert len({r.split("-", 2)[2].rsplit("-", 1)[0] for r in ranks}) == 1, ranks
            gpus = [set(r.rsplit("-", 1)[1].split("_")) for r in ranks]
            assert len(set().union(*gpus)) == sum(len(g) for g in gpus) == 8, ranks
    finally:
        server.stop()
