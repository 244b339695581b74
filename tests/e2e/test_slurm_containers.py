"""A containerised gang on the real Slurm cluster with the `oci` runtime (Slurm's own
`srun --container`, runc rootless), submitted through slurmrestd as an unprivileged user.

The image comes from a local registry (tests/fixtures/oci_registry.py). Every rank of a 2 x 8
gang, one per node, writes what only the image can show (its /etc/os-release and a marker file
that exists nowhere else), its rank and its node rank; the attempt's resolved record and
`isthmus snapshot` hold the manifest digest that ran. Moving the tag to another image and
submitting again records the new digest for the new job and leaves the old record as it was.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.oci_registry import REPO_TAG, RegistryImage
from tests.fixtures.slurm import SlurmCluster
from tests.harness.oci_image import MARKER, OS_ID, build_image
from tests.harness.server import ROOT, Server, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm

# Each rank writes its report into the job's directory (bound into the container at the same
# path), then waits for /shared/go (a `binds` entry) so the test sees it running.
RANK = (
    'o="$ISTHMUS_JOB_DIR/rank-$RANK.txt"; '
    f'{{ cat /etc/os-release; cat {MARKER}; '
    'echo "rank=$RANK/$WORLD_SIZE node_rank=$NODE_RANK master=$MASTER_ADDR"; } > "$o.tmp" '
    '&& cat "$o.tmp" > "$o"; '
    "while [ ! -e /shared/go ]; do sleep 0.2; done"
)


def _backend(cluster: SlurmCluster, work: Path, shared: Path) -> dict[str, Any]:
    return {
        "name": "slurm-local", "kind": "slurm",
        "settings": {
            "transport": "rest", "rest_url": cluster.rest_url, "rest_user": cluster.user_name,
            "rest_token": cluster.user_jwt, "work_dir": str(work), "python": "/usr/bin/python3",
            "rack_features": True,  # slurmrestd v0.0.38 has no switch count: rack features
            "container": {"runtime": "oci", "tls_verify": False,
                          "binds": [{"source": str(shared), "target": "/shared"}]},
        },
    }


def _spec(name: str, image: str) -> dict[str, Any]:
    return {
        "name": name, "team": "vision", "backend": "slurm", "flavors": ["a100-80g"],
        "gang": {"replicas": 2, "gpus_per_replica": 8},
        "entrypoint": {"image": image, "command": ["/bin/sh", "-c", RANK]},
        "max_runtime": "10m", "retry": {"max_attempts": 1},
    }


def _snapshot(server: Server, job_id: str) -> dict[str, Any]:
    """`isthmus snapshot JOB` as a user runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli.main", "snapshot", job_id, "--server", server.url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(json.loads(out))


def _resolved(server: Server, job_id: str) -> dict[str, Any] | None:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/attempts/1/snapshot", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    return body["resolved"] if body["resolved"] else None


def _reports(job_dir: Path) -> dict[str, str]:
    def written() -> dict[str, str] | None:
        got = {p.name: p.read_text() for p in job_dir.glob("rank-*.txt")}
        return got if len(got) == 2 and all("rank=" in t for t in got.values()) else None

    return wait_until(written, 60, f"both ranks' reports in {job_dir}")


def _run(server: Server, name: str, ref: str, shared: Path,
         work: Path) -> tuple[str, dict[str, Any], dict[str, str]]:
    """Submits a gang naming `ref`; returns (job id, resolved record while it ran, reports)."""
    job_id = server.submit(_spec(name, ref))["id"]

    def running() -> dict[str, Any] | None:
        job = server.job(job_id)
        assert job["state"] not in ("FAILED", "CANCELLED", "REJECTED"), job
        return _resolved(server, job_id) if job["state"] == "RUNNING" else None

    try:
        resolved = wait_until(running, 300, f"{name} running with a resolved record",
                              interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\njob: {server.job(job_id)}") from None
    attempt = httpx.get(f"{server.url}/v1/jobs/{job_id}/attempts", timeout=30).json()[0]
    reports = _reports(work / attempt["backend_name"])
    (shared / "go").touch()
    wait_until(lambda: server.job(job_id)["state"] == "SUCCEEDED", 120, f"{name} succeeded")
    (shared / "go").unlink()
    return job_id, resolved, reports


@pytest.fixture
def job_dirs(slurm_cluster: SlurmCluster) -> Iterator[tuple[Path, Path]]:
    """(work_dir, shared): where the job user (not root) can reach, unlike pytest's tmp_path;
    work_dir mode 1777 as a site makes it."""
    base = slurm_cluster.work_dir / f"containers-{uuid.uuid4().hex[:8]}"
    work, shared = base / "jobs", base / "shared"
    for d in (base, work, shared):
        d.mkdir()
        d.chmod(0o1777 if d is work else 0o755)
    yield work, shared
    shutil.rmtree(base, ignore_errors=True)


def test_gang_runs_inside_its_image_and_the_snapshot_records_the_digest(
    slurm_cluster: SlurmCluster, oci_registry: RegistryImage, tmp_path: Path,
    job_dirs: tuple[Path, Path],
) -> None:
    workdir, shared = job_dirs
    cfg = write_config(tmp_path / "isthmus.yaml", [_backend(slurm_cluster, workdir, shared)],
                       slurm_pools())
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    try:
        first, resolved, reports = _run(server, "in-image", oci_registry.ref, shared, workdir)
        digest = oci_registry.registry.digest(oci_registry.ref)
        assert digest == oci_registry.image.digest
        assert resolved["image_digest"] == digest, resolved
        assert resolved["image"] == oci_registry.ref
        assert len(set(resolved["nodes"])) == 2, resolved  # every rank on its own node
        for text in reports.values():
            assert f"ID={OS_ID}" in text, text
            assert oci_registry.image.marker in text, text
        lines = sorted(next(x for x in t.splitlines() if x.startswith("rank="))
                       for t in reports.values())
        assert [x.split()[:2] for x in lines] == [["rank=0/2", "node_rank=0"],
                                                  ["rank=1/2", "node_rank=1"]], lines
        exported = _snapshot(server, first)
        assert exported["resolved"]["image_digest"] == digest, exported

        # the tag now names another image: a new job records the new digest, the old stays
        moved = build_image("only-in-the-image-v2")
        oci_registry.registry.push(moved, REPO_TAG)
        second, resolved2, reports2 = _run(server, "in-image-again", oci_registry.ref, shared,
                                           workdir)
        assert resolved2["image_digest"] == moved.digest != digest, resolved2
        assert all(moved.marker in t for t in reports2.values()), reports2
        assert _snapshot(server, second)["resolved"]["image_digest"] == moved.digest
        assert _snapshot(server, first)["resolved"]["image_digest"] == digest
    finally:
        server.stop()
        oci_registry.registry.push(oci_registry.image, REPO_TAG)  # as the fixture made it


def _verdicts(explanation: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {p["pool"]: (p["reason"], p["message"]) for p in explanation["pools"]}


def test_a_pool_that_runs_no_images_is_never_chosen_for_an_image_job(
    slurm_cluster: SlurmCluster, oci_registry: RegistryImage, tmp_path: Path,
    job_dirs: tuple[Path, Path],
) -> None:
    """Two backends on the one cluster: slurm-bare (no container runtime: the default) owns
    the h100 partition, slurm-oci the a100 one. An image job preferring h100 runs in its image
    on a100, `plan` and `explain` giving h100's verdict as ImageUnsupported naming the pool; an
    image job that only fits h100 is rejected (NoPoolRunsImages); a job without an image still
    runs bare on h100."""
    workdir, shared = job_dirs
    bare = _backend(slurm_cluster, workdir, shared)
    bare["name"] = "slurm-bare"
    del bare["settings"]["container"]
    oci = _backend(slurm_cluster, workdir, shared)
    oci["name"] = "slurm-oci"
    h100, a100 = slurm_pools()
    h100["backend"], a100["backend"] = "slurm-bare", "slurm-oci"
    cfg = write_config(tmp_path / "isthmus.yaml", [bare, oci], [h100, a100])
    server = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    report = ['/bin/sh', '-c', f'cat {MARKER} > "$ISTHMUS_JOB_DIR/ran-$RANK.txt"']
    try:
        either = _spec("prefers-h100", oci_registry.ref)
        either.update(flavors=["h100-80g", "a100-80g"])
        either["gang"]["replicas"] = 1
        either["entrypoint"]["command"] = report
        plan = httpx.post(f"{server.url}/v1/plan", json=either, timeout=60).json()
        assert plan["admitted"] and plan["pool"] == "slurm-a100", plan
        reason, message = _verdicts(plan["explanation"])["slurm-h100"]
        assert reason == "ImageUnsupported" and "slurm-h100" in message, plan
        placed = server.submit(either)["id"]

        only_h100 = dict(either, name="only-h100", flavors=["h100-80g"])
        rejected = server.submit(only_h100)["id"]

        bare_job = dict(either, name="no-image", flavors=["h100-80g"],
                        entrypoint={"command": ["/bin/sh", "-c", "grep -q '^ID=debian' "
                                                "/etc/os-release"]})
        plain = server.submit(bare_job)["id"]

        def ended(job_id: str) -> str | None:
            state = str(server.job(job_id)["state"])
            return state if state in ("SUCCEEDED", "FAILED", "CANCELLED") else None

        assert wait_until(lambda: ended(placed), 180, "the image job to end") == "SUCCEEDED"
        attempt = httpx.get(f"{server.url}/v1/jobs/{placed}/attempts", timeout=30).json()[0]
        assert (attempt["backend"], attempt["pool"]) == ("slurm-oci", "slurm-a100"), attempt
        ran = (workdir / attempt["backend_name"] / "ran-0.txt").read_text()
        assert oci_registry.image.marker in ran  # in its image, on the pool that runs images
        assert wait_until(lambda: ended(plain), 180, "the bare job to end") == "SUCCEEDED"

        x = httpx.get(f"{server.url}/v1/jobs/{placed}/explain", timeout=30).json()
        reason, message = _verdicts(x["explanation"])["slurm-h100"]
        assert reason == "ImageUnsupported" and "slurm-h100" in message, x
        never = server.job(rejected)  # no pool offering h100 runs images: rejected at once
        assert (never["state"], never["reason"]) == ("REJECTED", "NoPoolRunsImages"), never
        assert "slurm-h100" in never["message"], never
    finally:
        server.stop()
