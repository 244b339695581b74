"""One broker, two real backends: jobs through the API land on the local Slurm cluster and on
the local Kubernetes control plane by flavor, capacity and constraint, and reach their
scripted ends; a job whose only fitting pool is drained waits with PoolDrained until undrain.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.store import attempts as att
from broker.store import open_database
from tests.harness.server import (
    FAKE,
    Server,
    job_spec,
    k8s_backend,
    k8s_pools,
    slurm_backend,
    slurm_pools,
    write_config,
)
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]


def _jobs() -> list[tuple[dict[str, Any], str, str, str | None]]:
    """(spec, expected state, expected reason, expected backend or None for either)."""
    out: list[tuple[dict[str, Any], str, str, str | None]] = []
    for i in range(4):
        out.append((job_spec(f"slurm-ok-{i}", ["a100-80g", "h100-80g"][i % 2], backend="slurm"),
                    "SUCCEEDED", "Succeeded", "slurm-local"))
    for i in range(2):
        out.append((job_spec(f"slurm-fail-{i}", "a100-80g", backend="slurm",
                             command=["bash", "-c", "exit 3"]),
                    "FAILED", "UserError", "slurm-local"))
    for i in range(4):
        out.append((job_spec(f"k8s-ok-{i}", ["h100-80g", "a100-80g"][i % 2], replicas=2,
                             backend="k8s", topology="rack"),
                    "SUCCEEDED", "Succeeded", "k8s-local"))
    for i in range(2):
        spec = job_spec(f"k8s-fail-{i}", "a100-80g", backend="k8s")
        spec["annotations"] = {f"{FAKE}exit-code": "3", f"{FAKE}duration": "1s"}
        out.append((spec, "FAILED", "UserError", "k8s-local"))
    for i in range(4):  # 4 x 8 in one rack: Slurm's racks hold 2 nodes a partition, so k8s
        out.append((job_spec(f"any-big-{i}", "a100-80g", replicas=4, topology="rack"),
                    "SUCCEEDED", "Succeeded", "k8s-local"))
    for i in range(4):
        out.append((job_spec(f"any-small-{i}", ["a100-80g", "h100-80g"][i % 2]),
                    "SUCCEEDED", "Succeeded", None))
    return out


def test_twenty_jobs_across_slurm_and_kubernetes(
    slurm_cluster: Any, k8s_cluster: Any, tmp_path: Path, workdir: Path
) -> None:
    # unique per run: a namespace of an earlier run may still be terminating
    namespace = f"isthmus-e2e-{uuid.uuid4().hex[:8]}"
    cfg = write_config(
        tmp_path / "isthmus.yaml",
        [slurm_backend(slurm_cluster, workdir), k8s_backend(k8s_cluster, namespace)],
        slurm_pools() + k8s_pools(),
    )
    db_url = f"sqlite:///{tmp_path / 'isthmus.db'}"
    server = Server(cfg, db_url, tmp_path / "server.log").start()
    try:
        # the drained pool first: the only pool that fits this job is k8s-h100
        r = httpx.post(f"{server.url}/v1/admin/pools/k8s-h100/drain",
                       json={"reason": "e2e"}, timeout=10)
        assert r.status_code == 200
        drained = server.submit(job_spec("drained", "h100-80g", replicas=4, backend="k8s",
                                         topology="rack"))["id"]
        wait_until(lambda: server.job(drained)["reason"] == "PoolDrained", 30,
                   "the job on a drained pool to say PoolDrained")
        expected = _jobs()
        assert len(expected) == 20
        ids = [server.submit(spec)["id"] for spec, _, _, _ in expected]
        assert httpx.post(f"{server.url}/v1/admin/pools/k8s-h100/undrain",
                          timeout=10).status_code == 200

        def ended() -> bool:
            return all(server.job(i)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED",
                                                  "REJECTED") for i in [*ids, drained])

        wait_until(ended, 300, "every job to end", interval=2)
        got = {i: server.job(i) for i in ids}
        renders = {}
        for i in (ids[0], ids[6]):  # a Slurm job and a Kubernetes job: what was created
            r = httpx.get(f"{server.url}/v1/jobs/{i}/attempts/1/render", timeout=10)
            assert r.status_code == 200, r.text
            renders[i] = r.text
        assert "#SBATCH" in renders[ids[0]] and "--no-requeue" in renders[ids[0]]
        assert "kind: Job" in renders[ids[6]] and "kind: Service" in renders[ids[6]]
        assert all("ISTHMUS_PROGRESS_TOKEN" not in t or "********" in t
                   for t in renders.values())
        assert server.job(drained)["state"] == "SUCCEEDED"
    finally:
        server.stop()
        with contextlib.suppress(Exception):  # best-effort cleanup
            k8s_cluster.delete_namespace(namespace)
    db = open_database(db_url, migrate=False)
    backends: dict[str, str] = {}
    with db.read() as s:
        for i in ids:
            backends[i] = att.attempts_of(s, i)[-1].backend
    db.dispose()
    for i, (spec, state, reason, backend) in zip(ids, expected, strict=True):
        job = got[i]
        assert (job["state"], job["reason"]) == (state, reason), (spec["name"], job)
        if backend is not None:
            assert backends[i] == backend, (spec["name"], backends[i])
    used = set(backends.values())
    assert used == {"slurm-local", "k8s-local"}, used
