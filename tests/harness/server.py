"""Real `isthmus server` processes over real backends, for end-to-end and crash tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.harness.paths import ROOT
from tests.harness.wait import wait_until

FAST_CONTROL = {
    "admission_interval": 0.5, "dispatch_interval": 0.3, "reconcile_interval": 0.5,
    "lease_ttl": 3.0, "lost_grace": 30.0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_backend(slurm: Any, work_dir: Path) -> dict[str, Any]:
    return {
        "name": "slurm-local", "kind": "slurm",
        "settings": {"transport": "cli", "slurm_conf": str(slurm.slurm_conf),
                     "work_dir": str(work_dir)},
    }


FAKE = "isthmus.io/fake-"


def k8s_backend(cluster: Any, namespace: str) -> dict[str, Any]:
    return {
        "name": "k8s-local", "kind": "k8s",
        "settings": {"kubeconfig": str(cluster.kubeconfig), "namespace": namespace,
                     "pod_annotations": {f"{FAKE}duration": "3s"}},
    }


def k8s_pools() -> list[dict[str, Any]]:
    cap = {"nodes": 8, "gpus_per_node": 8, "nodes_per_rack": 4, "racks_per_block": 2}
    return [
        {"name": "k8s-h100", "backend": "k8s-local", "flavor": "h100-80g",
         "node_selector": {"isthmus.io/pool": "h100"}, "capacity": cap},
        {"name": "k8s-a100", "backend": "k8s-local", "flavor": "a100-80g",
         "node_selector": {"isthmus.io/pool": "a100"}, "capacity": cap},
    ]


def slurm_pools() -> list[dict[str, Any]]:
    cap = {"nodes": 3, "gpus_per_node": 8, "nodes_per_rack": 2, "racks_per_block": 2}
    return [
        {"name": "slurm-h100", "backend": "slurm-local", "partition": "h100",
         "flavor": "h100-80g", "capacity": cap},
        {"name": "slurm-a100", "backend": "slurm-local", "partition": "a100",
         "flavor": "a100-80g", "capacity": cap},
    ]


def write_config(path: Path, backends: list[dict[str, Any]], pools: list[dict[str, Any]],
                 **extra: Any) -> Path:
    data = {
        "auth": {"mode": "none"},
        "control": dict(FAST_CONTROL),
        "flavors": [
            {"name": "h100-80g", "gpu_model": "NVIDIA-H100-80GB-HBM3", "gpu_memory_gb": 80,
             "cost_weight": 2.0},
            {"name": "a100-80g", "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpu_memory_gb": 80},
        ],
        "backends": backends,
        "pools": pools,
        "cohorts": [{"name": "research"}],
        # the test cluster's fake pods are scripted by these annotations (deploy/testenv/k8s)
        "tenancy": {"exempt_key_prefixes": ["isthmus.io/fake-"]},
        "teams": [
            {"name": "vision", "cohort": "research",
             "quotas": {"h100-80g": {"nominal": 256}, "a100-80g": {"nominal": 256}}},
        ],
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # type: ignore[dict-item]
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


class Server:
    """One `isthmus server` process."""

    def __init__(self, config: Path, db_url: str, log: Path,
                 env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.config, self.db_url, self.log = config, db_url, log
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> Server:
        env = {**os.environ, **self.env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.cli.main", "server", "--config", str(self.config),
                 "--db", self.db_url, "--port", str(self.port), *self.args],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        if wait:
            wait_until(self.healthy, 120, f"server on {self.url} ({self.log})")
        return self

    def healthy(self) -> dict[str, Any] | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}: "
                                 f"{self.log.read_text()[-3000:]}")
        try:
            r = httpx.get(f"{self.url}/healthz", timeout=2)
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def started_or_died(self, timeout: float = 30) -> bool:
        """Wait until the server answers (True) or has exited (False), e.g. by a crash point
        reached while it recovers."""
        def settled() -> str | None:
            if not self.alive():
                return "died"
            try:
                return "up" if self.healthy() else None
            except AssertionError:
                return "died"

        return bool(wait_until(settled, timeout, f"server on {self.url}") == "up")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def submit(self, spec: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        r = httpx.post(f"{self.url}/v1/jobs", json=spec, headers=headers, timeout=30)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def job(self, job_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/v1/jobs/{job_id}", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()


K8S_IMAGE = "registry.local/train:1.0"


def job_spec(name: str, flavor: str, replicas: int = 1, gpus: int = 8,
             command: list[str] | None = None, topology: str | None = None,
             backend: str = "any", image: str | None = None) -> dict[str, Any]:
    """A job for the test backends. It names K8S_IMAGE unless it is for Slurm only: the test
    cluster's Slurm backend has no container runtime (a job naming an image never goes there),
    and the fake Kubernetes nodes pull nothing."""
    entrypoint: dict[str, Any] = {"command": command or ["sleep", "1"]}
    if image or backend != "slurm":
        entrypoint["image"] = image or K8S_IMAGE
    return {
        "name": name, "team": "vision", "gang": {"replicas": replicas, "gpus_per_replica": gpus},
        "flavors": [flavor], "topology": {"required": topology} if topology else {},
        "backend": backend,
        "entrypoint": entrypoint,
        "max_runtime": "10m", "retry": {"max_attempts": 3, "backoff": "1s", "max_backoff": "2s"},
    }
