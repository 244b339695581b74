"""The control loop on the real local Kubernetes control plane: the kube-apiserver stopped
for 60 s while gangs run must not fail any job; everything converges after it is back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.server import FAKE, Server, job_spec, k8s_backend, k8s_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.k8s


def _apiserver_ready(cluster: Any) -> bool:
    try:
        cluster.core().list_namespace(limit=1, _request_timeout=3)
        return True
    except Exception:
        return False


def test_apiserver_outage_fails_no_job(k8s_cluster: Any, tmp_path: Path) -> None:
    namespace = "isthmus-e2e-outage"
    backend = k8s_backend(k8s_cluster, namespace)
    backend["settings"]["pod_annotations"] = {f"{FAKE}duration": "45s"}
    backend["settings"]["request_timeout_s"] = 5
    # the outage lasts twice the lost grace: a gang not seen for longer would be declared lost
    cfg = write_config(tmp_path / "isthmus.yaml", [backend], k8s_pools(),
                       control={"lost_grace": 15.0})
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    state_dir = Path(k8s_cluster.kubeconfig).parent
    pid_file = state_dir / "run" / "kube-apiserver.pid"
    try:
        ids = [server.submit(job_spec(f"k8s-outage-{i}", f, replicas=2, backend="k8s",
                                      topology="rack"))["id"]
               for i, f in enumerate(["a100-80g", "h100-80g", "a100-80g"])]
        wait_until(lambda: all(server.job(i)["state"] == "RUNNING" for i in ids), 90,
                   "all gangs running")
        pid = int(pid_file.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        # SIGKILL: the apiserver keeps no state of its own (etcd does), and a graceful stop
        # would wait for every open watch to drain
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists()
                   or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], 30,
                   "the apiserver to stop")
        seen: set[tuple[str, str]] = set()
        try:
            for _ in range(15):  # 30 s without an apiserver
                for i in ids:
                    j = server.job(i)
                    seen.add((j["state"], j["reason"]))
                    assert j["state"] not in ("FAILED", "RETRYING", "CANCELLED", "QUEUED"), j
                time.sleep(2)
            assert ("RUNNING", "BackendUnavailable") in seen, seen
        finally:  # start it again exactly as up did, and record its pid for `down`
            log = open(state_dir / "logs" / "kube-apiserver.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen([a.decode() for a in argv], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, start_new_session=True,
                                    cwd=state_dir)  # not this checkout: it may be deleted
            pid_file.write_text(f"{proc.pid}\n")
            wait_until(lambda: _apiserver_ready(k8s_cluster), 120, "the apiserver to be back")
        wait_until(lambda: all(server.job(i)["state"] == "SUCCEEDED" for i in ids), 180,
                   "every gang to succeed after the apiserver is back", interval=2)
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            k8s_cluster.delete_namespace(namespace)
