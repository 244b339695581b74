"""sbatch -N on the real local Kubernetes control plane (issue 28): a gang that asks for a node
per replica gets its pods on distinct nodes, by the scheduler's own rule (a required pod
anti-affinity), not only by the placement's choice of nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.server import Server, job_spec, k8s_backend, k8s_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s


def test_a_node_per_replica_lands_on_distinct_nodes(k8s_cluster: Any, tmp_path: Path) -> None:
    namespace = "isthmus-e2e-spread"
    cfg = write_config(tmp_path / "isthmus.yaml", [k8s_backend(k8s_cluster, namespace)],
                       k8s_pools())
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        spec = job_spec("spread", "a100-80g", replicas=2, gpus=4, backend="k8s")
        spec["gang"]["one_per_node"] = True
        job_id = server.submit(spec)["id"]
        core = k8s_cluster.core()

        def placed() -> list[Any] | None:
            pods = core.list_namespaced_pod(namespace,
                                            label_selector=f"isthmus.io/job={job_id}").items
            return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

        pods = wait_until(placed, 120, "both pods scheduled")
        assert len({p.spec.node_name for p in pods}) == 2, [p.spec.node_name for p in pods]
        anti = pods[0].spec.affinity.pod_anti_affinity
        (term,) = anti.required_during_scheduling_ignored_during_execution
        assert term.topology_key == "kubernetes.io/hostname"
        wait_until(lambda: server.job(job_id)["state"] == "SUCCEEDED", 180, "the gang to end")
    finally:
        server.stop()
