"""The drop-ins end to end on the real Slurm cluster through a real `isthmus server`: a batch
script with #SBATCH lines and its own srun runs as sbatch runs it, isqueue sees it R on its
nodes, isacct ends it COMPLETED 0:0; a failing script is FAILED with its exit code."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.dropins import isacct, isbatch, iscancel, isqueue
from tests.fixtures.slurm import SlurmCluster
from tests.harness.server import Server, slurm_backend, slurm_pools, write_config
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
COMPAT = {
    "default_partition": "a100",
    "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "slurm"},
                   "h100": {"flavors": ["h100-80g"], "backend": "slurm"}},
    "accounts": {"isthmus": "vision"},
    "gpu_types": {"a100": "a100-80g", "h100": "h100-80g"},
}
# Generous: the cluster and the two cores are shared with other test sessions.
DEADLINE = 240


@pytest.fixture
def server(slurm_cluster: SlurmCluster, tmp_path: Path, workdir: Path) -> Iterator[Server]:
    cfg = write_config(tmp_path / "isthmus.yaml", [slurm_backend(slurm_cluster, workdir)],
                       slurm_pools(), slurm_compat=COMPAT)
    srv = Server(cfg, f"sqlite:///{tmp_path / 'isthmus.db'}", tmp_path / "server.log").start()
    yield srv
    srv.stop()


def _script(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def _env(server: Server, home: Path) -> dict[str, str]:
    return {"ISTHMUS_URL": server.url, "HOME": str(home)}


def _queue(env: dict[str, str], job_id: str, capsys: pytest.CaptureFixture[str]) -> dict | None:
    assert isqueue.run(["--json", "-j", job_id], env) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    return jobs[0] if jobs else None


def _acct(env: dict[str, str], job_id: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert isacct.run(["-j", job_id, "-X", "-P", "-n",
                       "--format=JobID,JobName,State,ExitCode,NodeList,AllocTRES"], env) == 0
    return capsys.readouterr().out.strip().split("|")


ENDLESS = ("RUNNING", "PENDING")


def _acct_when(env: dict[str, str], job_id: str, capsys: pytest.CaptureFixture[str],
               ok: Callable[[str], bool]) -> list[str] | None:
    """isacct's row of the job once its state passes ``ok``, else None."""
    row = _acct(env, job_id, capsys)
    return row if ok(row[2]) else None


def test_gang_script_runs_as_sbatch_runs_it(server: Server, tmp_path: Path, workdir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = workdir / "ranks.txt"
    script = _script(tmp_path / "gang.sh", f"""#!/bin/bash
#SBATCH --job-name=e2e-gang
#SBATCH --partition=a100
#SBATCH --nodes=2
#SBATCH --gres=gpu:a100:8
#SBATCH --time=5
#SBATCH --account=isthmus
echo "batch on $(hostname) nodes=$SLURM_JOB_NUM_NODES" > {out}
srun bash -c 'echo "rank $SLURM_PROCID node $SLURMD_NODENAME gpus $CUDA_VISIBLE_DEVICES"' >> {out}
sleep 6
""")
    env = _env(server, tmp_path)
    assert isbatch.run([str(script)], env) == 0
    job_id = capsys.readouterr().out.split()[-1]

    running = wait_until(
        lambda: (j := _queue(env, job_id, capsys)) and j["job_state"] == "RUNNING" and j,
        DEADLINE, "isqueue shows the job R")
    assert running["nodes"].startswith("a100-[") and running["node_count"] == 2
    assert isqueue.run(["-h", "-j", job_id], env) == 0
    row = capsys.readouterr().out.split()
    assert row[4] == "R" and row[7] == running["nodes"]

    done = wait_until(lambda: _acct_when(env, job_id, capsys, lambda st: st not in ENDLESS),
                      DEADLINE, "isacct shows the job ended")
    assert done[:4] == [job_id, "e2e-gang", "COMPLETED", "0:0"], done
    assert "gres/gpu=16" in done[5] and "node=2" in done[5]
    lines = out.read_text().splitlines()
    # The script ran once (the batch step) and its own srun started one rank per node.
    assert lines[0].endswith("nodes=2") and sum(line.startswith("batch") for line in lines) == 1
    ranks = sorted(line.split()[1] for line in lines[1:])
    assert ranks == ["0", "1"]
    assert all(line.endswith("gpus 0,1,2,3,4,5,6,7") for line in lines[1:])


def test_failing_script_is_failed_with_its_exit_code(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path / "fail.sh", """#!/bin/bash
#SBATCH -J e2e-fail -N 1 --gres=gpu:1 -t 5 -A isthmus
echo failing
exit 3
""")
    env = _env(server, tmp_path)
    assert isbatch.run(["--parsable", str(script)], env) == 0
    job_id = capsys.readouterr().out.strip()
    done = wait_until(lambda: _acct_when(env, job_id, capsys, lambda st: st not in ENDLESS),
                      DEADLINE, "isacct shows the job ended")
    assert done[2:4] == ["FAILED", "3:0"], done
    assert isacct.run(["-j", job_id, "--json"], env) == 0
    (row,) = json.loads(capsys.readouterr().out)["jobs"]
    assert row["FailureCategory"] == "USER_ERROR"


def test_array_of_six_never_runs_more_than_two(
    server: Server, tmp_path: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(tmp_path / "array.sh", """#!/bin/bash
#SBATCH -J e2e-array -N 1 --gres=gpu:1 -t 5 -A isthmus
#SBATCH --array=0-5%2
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"
sleep 3
""")
    env = _env(server, tmp_path)
    assert isbatch.run([str(script)], env) == 0
    array_id = capsys.readouterr().out.split()[-1]
    most_isthmus = most_slurm = 0

    def all_ended() -> bool:
        nonlocal most_isthmus, most_slurm
        assert isqueue.run(["--json", "-j", array_id, "-t", "all"], env) == 0
        tasks = json.loads(capsys.readouterr().out)["jobs"]
        assert len(tasks) == 6
        running = [t for t in tasks if t["job_state"] == "RUNNING"]
        most_isthmus = max(most_isthmus, len(running))
        names = slurm_cluster.run(["squeue", "-h", "-t", "R", "-o", "%j"]).stdout.split()
        ours = {t["isthmus_id"] for t in tasks}
        most_slurm = max(most_slurm, sum(1 for n in names if n.split("-")[1:2] and
                                         n.split("-")[1] in ours))
        return all(t["job_state"] not in ("PENDING", "RUNNING") for t in tasks)

    wait_until(all_ended, DEADLINE * 2, "all six array tasks ended", interval=0.3)
    assert 1 <= most_isthmus <= 2 and most_slurm <= 2
    assert isacct.run(["-j", array_id, "-P", "-n", "--format=JobID,State,ExitCode"], env) == 0
    rows = sorted(capsys.readouterr().out.split())
    assert rows == sorted(f"{array_id}_{i}|COMPLETED|0:0" for i in range(6))


def test_afterok_holds_until_the_parent_succeeds(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _env(server, tmp_path)
    parent = _script(tmp_path / "parent.sh", """#!/bin/bash
#SBATCH -J e2e-parent -N 1 --gres=gpu:1 -t 5 -A isthmus
sleep 6
""")
    bad_parent = _script(tmp_path / "bad.sh", """#!/bin/bash
#SBATCH -J e2e-bad -N 1 --gres=gpu:1 -t 5 -A isthmus
exit 1
""")
    child = _script(tmp_path / "child.sh", """#!/bin/bash
#SBATCH -J e2e-child -N 1 --gres=gpu:1 -t 5 -A isthmus
true
""")
    assert isbatch.run(["--parsable", str(parent)], env) == 0
    parent_id = capsys.readouterr().out.strip()
    assert isbatch.run(["--parsable", str(bad_parent)], env) == 0
    bad_id = capsys.readouterr().out.strip()
    assert isbatch.run(["--parsable", f"--dependency=afterok:{parent_id}", str(child)], env) == 0
    child_id = capsys.readouterr().out.strip()
    assert isbatch.run(["--parsable", f"-d afterok:{bad_id}".replace(" ", ""), str(child)],
                       env) == 0
    orphan_id = capsys.readouterr().out.strip()

    wait_until(lambda: (j := _queue(env, parent_id, capsys)) and j["job_state"] == "RUNNING",
               DEADLINE, "the parent runs")
    waiting = _queue(env, child_id, capsys)
    assert waiting is not None and waiting["job_state"] == "PENDING"
    assert waiting["state_reason"] == "WaitingForDependency"

    done = wait_until(lambda: _acct_when(env, child_id, capsys, lambda st: st == "COMPLETED"),
                      DEADLINE, "the child completes")
    assert done[3] == "0:0"
    assert isacct.run(["-j", f"{parent_id},{child_id}", "-P", "-n",
                       "--format=JobID,State,Start,End"], env) == 0
    rows = {r.split("|")[0]: r.split("|") for r in capsys.readouterr().out.split()}
    assert rows[parent_id][1] == "COMPLETED"
    assert rows[child_id][2] >= rows[parent_id][3]  # started after the parent ended
    never = wait_until(lambda: _acct_when(env, orphan_id, capsys,
                                          lambda st: st.startswith("CANCELLED")),
                       DEADLINE, "the child of a failed parent is cancelled")
    assert never[2] == "CANCELLED by 0"  # by the broker, as slurmctld's own cancels read
    assert isqueue.run(["--json", "-t", "CA", "-j", orphan_id], env) == 0
    (row,) = json.loads(capsys.readouterr().out)["jobs"]
    assert row["state_reason"] == "DependencyNeverSatisfied"


def test_output_error_and_exclusive_reach_slurm(
    server: Server, tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--output/--error become the batch script's files with %j, %x, %A, %a as the user knows
    them (the Isthmus id, the name; not in an array: the id and Slurm's 4294967294);
    --exclusive reaches sbatch (scontrol shows OverSubscribe=NO); --mail-* are kept."""
    script = _script(tmp_path / "files.sh", """#!/bin/bash
#SBATCH -J e2e-files -N 1 --gres=gpu:a100:1 -t 5 -A isthmus
#SBATCH --output=out-%j-%x-%A-%a.txt
#SBATCH -e err-%j.txt
#SBATCH --exclusive
#SBATCH --mail-type=END
#SBATCH --mail-user=ada@example.org
echo to-stdout
echo to-stderr >&2
scontrol show job "$SLURM_JOB_ID" | grep -o 'OverSubscribe=[A-Z]*'
""")
    env = _env(server, tmp_path)
    assert isbatch.run(["--parsable", f"--chdir={workdir}", str(script)], env) == 0
    job_id = capsys.readouterr().out.strip()
    done = wait_until(lambda: _acct_when(env, job_id, capsys, lambda st: st not in ENDLESS),
                      DEADLINE, "isacct shows the job ended")
    assert done[2:4] == ["COMPLETED", "0:0"], done
    out = workdir / f"out-{job_id}-e2e-files-{job_id}-4294967294.txt"
    assert out.read_text().split() == ["to-stdout", "OverSubscribe=NO"]
    assert (workdir / f"err-{job_id}.txt").read_text().split() == ["to-stderr"]
    import httpx

    spec = httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()["spec"]
    assert spec["entrypoint"]["batch"] == {
        "output": f"{workdir}/out-%j-%x-%A-%a.txt", "error": f"{workdir}/err-%j.txt",
        "exclusive": True}
    request = json.loads(spec["annotations"]["sbatch.isthmus.io/request"])
    assert request["options"]["mail_user"] == "ada@example.org"
    assert request["options"]["mail_type"] == "END"


def test_iscancel_signal_reaches_the_steps(
    server: Server, tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """iscancel --signal=USR1 sends the signal as scancel --signal does: the script's srun step
    gets it (its trap writes a file and ends the step), the job goes on and completes."""
    ready, got = workdir / "ready", workdir / "got"
    script = _script(tmp_path / "trap.sh", f"""#!/bin/bash
#SBATCH -J e2e-signal -N 1 --gres=gpu:a100:1 -t 5 -A isthmus
srun bash -c 'trap "echo USR1 > {got}; exit 0" USR1; touch {ready}; \
  for i in $(seq 600); do sleep 0.2; done; exit 7'
echo after-step
""")
    env = _env(server, tmp_path)
    assert iscancel.run(["--signal=NOPE", "06h0000000000000"], env) == 1
    assert "Invalid job signal: NOPE" in capsys.readouterr().err
    assert isbatch.run(["--parsable", str(script)], env) == 0
    job_id = capsys.readouterr().out.strip()
    wait_until(lambda: (j := _queue(env, job_id, capsys)) and j["job_state"] == "RUNNING"
               and ready.exists(), DEADLINE, "the job runs and its step is ready")
    assert iscancel.run(["-v", "--signal=SIGUSR1", job_id], env) == 0
    assert f"Signal USR1 to job {job_id}" in capsys.readouterr().err
    # the trap's `echo USR1 > got` makes the file before it writes: wait for what it wrote
    wait_until(lambda: got.exists() and got.read_text().strip(), 60, "the step's trap to run")
    assert got.read_text().strip() == "USR1"
    done = wait_until(lambda: _acct_when(env, job_id, capsys, lambda st: st not in ENDLESS),
                      DEADLINE, "isacct shows the job ended")
    assert done[2:4] == ["COMPLETED", "0:0"], done  # signalled, not cancelled


def test_scontrol_requeue_runs_the_job_again_under_its_id(
    server: Server, tmp_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """iscontrol requeue as scontrol requeue: the running job is stopped and runs again under
    the same number, told SLURM_RESTART_COUNT=1 as a requeued Slurm job is (the usual
    checkpoint-and-requeue script resumes on it); it then completes. A pending job is
    refused in Slurm's words."""
    from broker.dropins import iscontrol

    runs, ready = workdir / "runs.txt", workdir / "ready"
    script = _script(tmp_path / "requeue.sh", f"""#!/bin/bash
#SBATCH -J e2e-requeue -N 1 --gres=gpu:a100:1 -t 5 -A isthmus
echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {runs}
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then exit 0; fi
touch {ready}
for i in $(seq 1200); do sleep 0.2; done
exit 7
""")
    env = _env(server, tmp_path)
    assert isbatch.run(["--parsable", str(script)], env) == 0
    number = capsys.readouterr().out.strip()
    wait_until(lambda: (j := _queue(env, number, capsys)) and j["job_state"] == "RUNNING"
               and ready.exists(), DEADLINE, "the job runs")
    assert iscontrol.run(["requeue", number], env) == 0
    done = wait_until(lambda: _acct_when(env, number, capsys, lambda st: st not in ENDLESS),
                      DEADLINE, "isacct shows the job ended")
    assert done[2:4] == ["COMPLETED", "0:0"], done
    assert runs.read_text().split() == ["restart=0", "restart=1"]
    assert isbatch.run(["--parsable", "--hold", str(script)], env) == 0
    held = capsys.readouterr().out.strip()
    assert iscontrol.run(["requeue", held], env) == 1
    assert f"Job is pending execution for job {held}" in capsys.readouterr().err
    assert iscancel.run([held], env) == 0
