"""The drop-ins' output against the real Slurm commands' output for the same jobs (issue 28).

Jobs go through isbatch to a real `isthmus server` whose backend is the real local Slurm
cluster; each Isthmus job is one Slurm job (its id in the job's current run). For each, the
fields tools parse are read both ways, `isacct`/`isqueue`/`iscontrol` by the Isthmus number
and `sacct`/`squeue`/`scontrol` by the Slurm id, and compared field by field. What differs on
purpose is named: the ids (Isthmus's number vs Slurm's), the job name (Slurm's is the backend
object's), and a cancel's state and exit code (`_agree`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from broker.domain.hostlist import expand
from broker.dropins import isacct, isbatch, iscancel, iscontrol, isqueue
from tests.fixtures.slurm import SlurmCluster
from tests.harness.server import Server, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
COMPAT = {
    "default_partition": "a100",
    "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "slurm"}},
    "accounts": {"isthmus": "vision"},
    "gpu_types": {"a100": "a100-80g"},
}
DEADLINE = 240
CANCEL_GRACE_S = 120  # a job's default checkpoint grace (spec checkpoint.grace)
SACCT = "State,ExitCode,NodeList,NNodes,Start,End,Elapsed,AllocTRES"


@pytest.fixture
def server(slurm_cluster: SlurmCluster, tmp_path: Path, workdir: Path) -> Iterator[Server]:
    cfg = write_config(tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)],
                       slurm_pools(), slurm_compat=COMPAT)
    srv = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    yield srv
    srv.stop()


def _submit(env: dict[str, str], path: Path, body: str,
            capsys: pytest.CaptureFixture[str]) -> str:
    path.write_text(body)
    assert isbatch.run(["--parsable", str(path)], env) == 0
    return capsys.readouterr().out.strip()


def _slurm_id(server: Server, number: str) -> str | None:
    items = httpx.get(f"{server.url}/v1/hpc/jobs", timeout=30).json()["items"]
    (item,) = [i for i in items if str(i["number"]) == number]
    run = item.get("run") or {}
    return run.get("backend_id")


def _ours(env: dict[str, str], number: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert isacct.run(["-X", "-P", "-n", "-j", number, f"--format={SACCT}"], env) == 0
    return capsys.readouterr().out.strip().split("|")


def _theirs(slurm: SlurmCluster, slurm_id: str) -> list[str]:
    out = slurm.run(["sacct", "-X", "-P", "-n", "-j", slurm_id, f"--format={SACCT}"]).stdout
    return out.strip().splitlines()[0].split("|")


def _tres(text: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in text.split(",") if "=" in p)


def _agree(ours: list[str], theirs: list[str], cancelled: bool = False) -> None:
    """Field by field. A job cancelled through Isthmus is stopped gracefully (its stop signal,
    its grace, then the kill), so Slurm's record of that one Slurm job says how the script
    ended (FAILED with the signal's exit code, or CANCELLED by the broker's uid), while
    isacct says what the user did: CANCELLED by them. Its state and exit code differ on
    purpose. Its end is when the broker sent the stop (the GPUs are charged up to there), so
    Slurm's End may come up to the stop's grace later (a second, across a clock tick, for a
    script that stops at once); everything else must not differ."""
    o, t = dict(zip(SACCT.split(","), ours, strict=True)), \
        dict(zip(SACCT.split(","), theirs, strict=True))
    if cancelled:
        assert re.match(r"^CANCELLED by \d+$", o["State"]), (o, t)
        lag = (datetime.fromisoformat(t["End"]) - datetime.fromisoformat(o["End"])).total_seconds()
        assert 0 <= lag <= CANCEL_GRACE_S, ("End", o, t)
    else:
        assert o["State"] == t["State"], (o, t)
        assert o["ExitCode"] == t["ExitCode"], (o, t)
    for key in ("NodeList", "NNodes", "Start") + (() if cancelled else ("End", "Elapsed")):
        assert o[key] == t[key], (key, o, t)
    ours_tres, theirs_tres = _tres(o["AllocTRES"]), _tres(t["AllocTRES"])
    for key in ("gres/gpu", "node"):
        assert ours_tres.get(key) == theirs_tres.get(key), (key, o, t)


def _scontrol(text: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def test_isacct_isqueue_and_iscontrol_read_as_sacct_squeue_and_scontrol(
        server: Server, slurm_cluster: SlurmCluster, tmp_path: Path, workdir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    env = {"ISTHMUS_URL": server.url, "HOME": str(tmp_path)}
    head = "#!/bin/bash\n#SBATCH -t 5 -A isthmus\n"
    gang = _submit(env, tmp_path / "gang.sh", head + "#SBATCH -N 2 --gres=gpu:a100:8\n"
                   "srun true\nsleep 2\n", capsys)
    failing = _submit(env, tmp_path / "fail.sh", head + "#SBATCH --gres=gpu:1\nexit 3\n",
                      capsys)
    ready = workdir / "long-ready"
    long = _submit(env, tmp_path / "long.sh", head + "#SBATCH --gres=gpu:1\n"
                   f"touch {ready}\nsleep 300\n", capsys)

    # while it runs: squeue and scontrol against isqueue and iscontrol
    wait_until(lambda: ready.exists() and _slurm_id(server, long), DEADLINE, "the long job runs")
    slurm_long = _slurm_id(server, long)
    assert slurm_long is not None

    def running_both() -> tuple[str, str] | None:
        assert isqueue.run(["-h", "-j", long, "-o", "%T %D %N"], env) == 0
        ours = capsys.readouterr().out.strip()
        theirs = slurm_cluster.run(["squeue", "-h", "-j", slurm_long, "-o", "%T %D %N"]
                                   ).stdout.strip()
        return (ours, theirs) if ours.startswith("RUNNING") and ours == theirs else None

    ours_q, theirs_q = wait_until(running_both, DEADLINE, "isqueue and squeue agree")
    assert ours_q == theirs_q
    assert iscontrol.run(["-o", "show", "job", long], env) == 0
    ours_c = _scontrol(capsys.readouterr().out)
    theirs_c = _scontrol(slurm_cluster.run(["scontrol", "-o", "show", "job", slurm_long]).stdout)
    for key in ("JobState", "NodeList", "NumNodes", "ExitCode", "StartTime", "TimeLimit"):
        assert ours_c[key] == theirs_c[key], (key, ours_c, theirs_c)

    assert iscancel.run([long], env) == 0
    capsys.readouterr()

    def ended(number: str) -> list[str] | None:
        row = _ours(env, number, capsys)
        return row if row[0] not in ("PENDING", "RUNNING") else None

    for number in (gang, failing, long):
        wait_until(lambda n=number: ended(n), DEADLINE, f"job {number} ended")  # type: ignore[misc]
        slurm_id = _slurm_id(server, number)
        assert slurm_id is not None

        def accounted(sid: str = slurm_id) -> list[str] | None:
            row = _theirs(slurm_cluster, sid)
            fields = dict(zip(SACCT.split(","), row, strict=True))
            # slurmdbd's record can lag behind the job's end: wait until it names every node
            whole = str(len(expand(fields["NodeList"]))) == fields["NNodes"]
            return row if whole and row[0] not in ("PENDING", "RUNNING", "COMPLETING") \
                else None

        theirs = wait_until(accounted, DEADLINE, f"sacct has Slurm job {slurm_id}")

        def disagreement(n: str = number, t: list[str] = theirs) -> str | None:
            try:
                _agree(_ours(env, n, capsys), t, cancelled=n == long)
            except AssertionError as exc:
                return str(exc)
            return None

        # the broker's facts catch up with Slurm's accounting within a reconcile or two
        try:
            wait_until(lambda d=disagreement: d() is None, 60,  # type: ignore[misc]
                       f"isacct and sacct to agree on {number}")
        except AssertionError:
            _agree(_ours(env, number, capsys), theirs, number == long)  # names the field
            raise
    states = {n: _ours(env, n, capsys)[0] for n in (gang, failing, long)}
    assert states[gang] == "COMPLETED" and states[failing] == "FAILED"
    assert states[long].startswith("CANCELLED by "), states
