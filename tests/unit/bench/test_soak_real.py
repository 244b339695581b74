"""The pieces of bench/soak_real.py (the soak against the real clusters) that need no cluster:
the configuration it writes, the jobs it submits (their command really posts progress), the
outage switch (stop a daemon by its pid file, start it again, note BackendUnavailable jobs
meanwhile), and the harness's kept connections surviving a server's keep-alive timeout."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.soak import Conns, _free_port
from bench.soak_real import (
    SlurmctldOutage,
    cluster_env,
    config_for,
    job_command,
    real_spec,
    slurm_up_env,
    status_classes,
)
from broker.config import parse_config
from broker.domain.spec import JobSpec
from tests.harness.wait import wait_until

SLURM = {"SLURM_CONF": "/tmp/s/etc/slurm.conf", "SLURMRESTD_URL": "http://127.0.0.1:19220",
         "SLURM_PARTITIONS": "a100,h100",
         "SLURM_NODES": "a100-1,a100-2,a100-3,h100-1,h100-2,h100-3", "SLURM_GPUS_PER_NODE": "8"}
K8S = {"KUBECONFIG": "/tmp/k/kubeconfig", "K8S_NODES_PER_POOL": "8", "K8S_GPUS_PER_NODE": "8"}


def test_cluster_env_reads_the_up_scripts_env_file(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("SLURM_CONF=/x/slurm.conf\nSLURM_JWT=a=b\n\n")
    assert cluster_env(tmp_path) == {"SLURM_CONF": "/x/slurm.conf", "SLURM_JWT": "a=b"}


def test_the_restart_finds_the_same_cluster_again() -> None:
    # deploy/testenv/slurm/up: REST_PORT=$((PORT_BASE + 20)); NODES_PER_TYPE per partition
    assert slurm_up_env(SLURM, Path("/tmp/slurm-soak")) == {
        "ISTHMUS_SLURM_STATE": "/tmp/slurm-soak", "ISTHMUS_SLURM_PORT_BASE": "19200",
        "ISTHMUS_SLURM_NODES_PER_TYPE": "3"}
    up = (Path(__file__).resolve().parents[3] / "deploy/testenv/slurm/up").read_text()
    assert "REST_PORT=$((PORT_BASE + 20))" in up


def test_config_points_at_the_clusters_and_shares_their_gpus(tmp_path: Path) -> None:
    cfg = config_for(SLURM, K8S, "isthmus-soak-x", tmp_path / "jobs")
    parsed = parse_config(cfg)
    backends = {b.name: b for b in parsed.backends}
    assert backends["slurm-local"].settings["slurm_conf"] == SLURM["SLURM_CONF"]
    assert backends["slurm-local"].settings["work_dir"] == str(tmp_path / "jobs")
    assert backends["k8s-local"].settings == {"kubeconfig": K8S["KUBECONFIG"],
                                              "namespace": "isthmus-soak-x"}
    nodes = {p.name: p.capacity.nodes if p.capacity else 0 for p in parsed.pools}
    assert nodes == {"slurm-h100": 3, "slurm-a100": 3, "k8s-h100": 8, "k8s-a100": 8}
    # 3 x 8 on Slurm + 8 x 8 on Kubernetes per flavor = 88 GPUs, a quarter to each team
    assert [t.name for t in parsed.teams] == ["vision", "language", "speech", "robotics"]
    for team in parsed.teams:
        assert {f: q.nominal for f, q in team.quotas.items()} == {"a100-80g": 22, "h100-80g": 22}
    assert parsed.tenancy.exempt_key_prefixes == ["isthmus.io/fake-"]
    # every call authenticated, each team by its own token, as the load makes them
    assert parsed.auth.mode == "token"
    assert [(t.team, t.role.value) for t in parsed.auth.tokens] == [
        (t, "user") for t in ["vision", "language", "speech", "robotics"]]


def test_specs_are_valid_short_jobs_of_the_soaks_shapes(tmp_path: Path) -> None:
    make = real_spec(["http://127.0.0.1:1"], tmp_path / "codes")
    rng = random.Random(3)
    specs = [make(f"soak-{i}", "speech", rng) for i in range(200)]
    for s in specs:
        JobSpec.model_validate(s)
        pause = int(s["entrypoint"]["command"][2].rsplit("sleep ", 1)[1].split(";")[0])
        assert 1 <= pause <= 3
        assert s["annotations"] == {"isthmus.io/fake-duration": f"{2 * pause}s"}
        assert (s["gang"]["replicas"] > 1) == (s["topology"] == {"required": "rack"})
    assert {(s["gang"]["gpus_per_replica"], s["gang"]["replicas"]) for s in specs} == {
        (1, 1), (2, 1), (4, 1), (8, 1), (8, 2)}


class _Progress(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.headers["Authorization"], body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.skipif(shutil.which("curl") is None, reason="the jobs' command uses curl")
def test_job_command_reports_progress_to_the_first_replica_that_answers(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Progress)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    codes = tmp_path / "codes"
    dead = f"http://127.0.0.1:{_free_port()}"
    try:
        cmd = job_command([dead, f"http://127.0.0.1:{server.server_port}"], codes, 0)
        subprocess.run(cmd, check=True, timeout=60, env={
            "PATH": "/usr/bin:/bin", "ISTHMUS_PROGRESS_TOKEN": "tok", "ISTHMUS_JOB_ID": "j1"})
    finally:
        server.shutdown()
    assert _Progress.seen == [("/v1/jobs/j1/progress", "Bearer tok", {"step": 1}),
                              ("/v1/jobs/j1/progress", "Bearer tok", {"step": 2})]
    assert codes.read_text() == "200\n200\n"
    assert status_classes(codes) == {"2xx": 2}


def test_outage_stops_the_daemon_then_restarts_it_and_notes_unavailable_jobs(
        tmp_path: Path) -> None:
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pidfile = tmp_path / "slurmctld.pid"
    pidfile.write_text(f"{daemon.pid}\n")
    restarted = tmp_path / "restarted"
    samples: list[set[str]] = [{"a"}, {"a", "b"}]
    outage = SlurmctldOutage(pidfile, ["touch", str(restarted)], {"PATH": "/usr/bin:/bin"},
                             lambda: samples.pop(0) if samples else {"c"}, every=0.05)
    try:
        outage.begin()
        assert daemon.wait(timeout=30) < 0  # ended by the signal
        wait_until(lambda: "c" in outage.seen, 30, "the sampler to run a few times")
        assert not restarted.exists()
        outage.end()
        assert outage.finish(timeout=30) == 0
        assert restarted.exists()
        assert outage.seen == {"a", "b", "c"}
    finally:
        daemon.kill()


def test_a_kept_connection_the_server_closed_is_opened_again() -> None:
    async def run() -> list[int]:
        closed = asyncio.Queue[None]()

        async def answer_once(reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()  # as a keep-alive timeout does, between two requests
            await writer.wait_closed()
            closed.put_nowait(None)

        server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = Conns(port, 1)
        out = []
        for _ in range(3):
            out.append((await conns.request("GET", "/", None, {})).status)
            await asyncio.wait_for(closed.get(), 60)  # the server closed the kept connection
        server.close()
        return out

    assert asyncio.run(run()) == [200, 200, 200]
