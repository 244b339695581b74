"""isbatch, isqueue, iscancel and isacct against a real `isthmus server` (control loop off, so
jobs wait): submission through slurm_compat with the user's token, team scoping, Slurm-style
output and refusals."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.dropins import isacct, isbatch, iscancel, isqueue
from tests.harness.server import Server, slurm_pools, write_config

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"vision": "tok-vision-1", "language": "tok-language-1", "capped": "tok-capped-1"}
CAPPED = {"user_limits": {"queued_jobs": 1}}  # team capped: one waiting job per user
COMPAT = {
    "default_partition": "a100",
    "partitions": {"a100": {"flavors": ["a100-80g"]}, "h100": {"flavors": ["h100-80g"]}},
    "accounts": {"vis": "vision", "lang": "language"},
    "qos": {"normal": "normal", "high": "high"},
    "gpu_types": {"a100": "a100-80g", "h100": "h100-80g"},
    "image": "python:3.12-slim",
}
SCRIPT = """#!/bin/bash
#SBATCH -J pretrain
#SBATCH -N 2
#SBATCH --gres=gpu:a100:8
#SBATCH -t 30
srun hostname
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("dropins")
    tokens = [
        {"name": f"{team}-user", "team": team,
         "token_sha256": hashlib.sha256(secret.encode()).hexdigest()}
        for team, secret in TOKENS.items()
    ]
    backend = {"name": "slurm-local", "kind": "slurm",
               "settings": {"transport": "cli", "slurm_conf": str(tmp / "none.conf")}}
    cfg = write_config(
        tmp / "isthmus.yaml", [backend], slurm_pools(),
        auth={"mode": "token", "tokens": tokens}, control={"enabled": False},
        slurm_compat=COMPAT,
        teams=[{"name": t, "quotas": {"a100-80g": {"nominal": 64}, "h100-80g": {"nominal": 64}},
                **(CAPPED if t == "capped" else {})} for t in TOKENS],
    )
    srv = Server(cfg, f"sqlite:///{tmp / 'isthmus.db'}", tmp / "server.log").start()
    yield srv
    srv.stop()


def env_for(server: Server, team: str, home: Path) -> dict[str, str]:
    return {"ISTHMUS_URL": server.url, "ISTHMUS_TOKEN": TOKENS[team], "HOME": str(home)}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "pretrain.sh"
    path.write_text(SCRIPT)
    return path


def test_submit_queue_cancel_account(server: Server, script: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(server, "vision", tmp_path)
    assert isbatch.run([str(script)], env) == 0
    out = capsys.readouterr().out
    assert out.startswith("Submitted batch job ")
    job_id = out.split()[-1]
    assert job_id.isdigit()  # Slurm's tools read the id with a regular expression for digits

    assert isqueue.run(["-j", job_id], env) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES",
                                "NODELIST(REASON)"]
    row = lines[1].split()
    assert row[0] == job_id and row[1] == "a100" and row[4] == "PD" and row[6] == "2"
    assert row[3] == "vision-u"  # squeue's 8-character USER column
    assert row[7].startswith("(") and row[7].endswith(")")

    # Another team neither sees nor cancels it; the answer is scancel's for an unknown id.
    other = env_for(server, "language", tmp_path)
    assert isqueue.run(["-h"], other) == 0
    assert job_id not in capsys.readouterr().out
    assert iscancel.run([job_id], other) == 1
    assert f"Kill job error on job id {job_id}: Invalid job id specified" in (
        capsys.readouterr().err)

    assert iscancel.run([job_id], env) == 0
    assert isacct.run(["-j", job_id, "-P", "--format=JobID,JobName,Account,State,ExitCode"],
                      env) == 0
    # sacct's "CANCELLED by UID" (the canceller's uid on this host; this token's user has none
    # here, so Slurm's NO_VAL); in a column of 10, cut as sacct cuts it
    assert capsys.readouterr().out.splitlines() == [
        "JobID|JobName|Account|State|ExitCode",
        f"{job_id}|pretrain|vision|CANCELLED by 4294967294|0:0"]
    assert isacct.run(["-j", job_id, "-n", "-X", "--format=JobID,State"], env) == 0
    assert capsys.readouterr().out.split() == [job_id, "CANCELLED+"]
    assert isacct.run(["-j", job_id, "-n", "-X", "--format=JobID,State%30"], env) == 0
    assert capsys.readouterr().out.split() == [job_id, "CANCELLED", "by", "4294967294"]
    assert isacct.run(["-n", "-X", "-P", "-s", "CA", "--format=JobID"], env) == 0
    assert job_id in capsys.readouterr().out.split()  # -s CA still finds it

    assert isacct.run(["-j", job_id, "--json"], env) == 0
    (acct,) = json.loads(capsys.readouterr().out)["jobs"]
    assert acct["State"] == "CANCELLED by 4294967294" and acct["JobIDRaw"] == job_id


def test_parsable_account_qos_and_the_spec(server: Server, script: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(server, "vision", tmp_path)
    assert isbatch.run(["--parsable", "-A", "vis", "-q", "high", str(script)], env) == 0
    job_id = capsys.readouterr().out.strip()
    assert isqueue.run(["--json", "-j", job_id], env) == 0
    (row,) = json.loads(capsys.readouterr().out)["jobs"]
    assert (row["account"], row["node_count"], row["gpus_per_node"]) == ("vision", 2, 8)
    assert isbatch.run(["--parsable", "-M", "gpu-east", str(script)], env) == 0
    number, cluster = capsys.readouterr().out.strip().split(";")  # sbatch's ID;CLUSTER
    assert number.isdigit() and int(number) > int(job_id) and cluster == "gpu-east"
    assert iscancel.run(["-n", "pretrain"], env) == 0


def test_refusals_submit_nothing(server: Server, script: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(server, "vision", tmp_path)
    assert isbatch.run(["-p", "v100", str(script)], env) == 1
    err = capsys.readouterr().err  # the broker's mapping refused it, said as sbatch says it
    assert "invalid partition specified: v100" in err and "HTTP" not in err
    assert isbatch.run(["-A", "lang", str(script)], env) == 1  # another team's account
    assert "team" in capsys.readouterr().err
    assert isbatch.run(["--time=2h", str(script)], env) == 1
    assert "Invalid --time specification" in capsys.readouterr().err
    assert isqueue.run(["-h", "-t", "all"], env) == 0
    assert "v100" not in capsys.readouterr().out


def test_a_queued_jobs_limit_is_said_as_sbatch_says_a_submit_limit(
        server: Server, script: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(server, "capped", tmp_path)
    assert isbatch.run([str(script)], env) == 0
    capsys.readouterr()
    assert isbatch.run([str(script)], env) == 1
    err = capsys.readouterr().err
    assert err.startswith("isbatch: error: Batch job submission failed: Job violates "
                          "accounting/QOS policy (job submit limit)")
    assert "teams[capped].user_limits.queued_jobs allows 1" in err and "HTTP" not in err


def test_console_script_with_a_config_file(server: Server, script: Path, tmp_path: Path) -> None:
    conf = tmp_path / ".config" / "isthmus" / "client.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"url: {server.url}\ntoken: {TOKENS['vision']}\n")
    conf.chmod(0o644)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    isbatch_bin = ROOT / ".venv" / "bin" / "isbatch"
    proc = subprocess.run([str(isbatch_bin), str(script)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "chmod 600" in proc.stderr
    conf.chmod(0o600)
    proc = subprocess.run([str(isbatch_bin), "--parsable", str(script)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "iscancel"), job_id], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_one_api_call_per_submission(server: Server, script: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """isbatch sends its parsed request once (POST /v1/hpc/batch): the broker maps it, resolves
    --dependency and splits an array; nothing else is asked, for a plain job, an array or a
    dependency."""
    from broker.client import Client

    calls: list[tuple[str, str]] = []
    real = Client.call

    def counted(self: Client, method: str, path: str, *args: object, **kw: object) -> object:
        calls.append((method, path))
        return real(self, method, path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "call", counted)
    env = env_for(server, "vision", tmp_path)
    assert isbatch.run(["--parsable", "--export=ALL,LR=0.1", str(script)], env) == 0
    parent = capsys.readouterr().out.strip()
    assert calls == [("POST", "/v1/hpc/batch")]
    assert isbatch.run(["--parsable", "--array=0-2%1", f"--dependency=afterok:{parent}",
                        str(script)], env) == 0
    array_id = capsys.readouterr().out.strip()
    assert calls == [("POST", "/v1/hpc/batch")] * 2
    monkeypatch.setattr(Client, "call", real)
    assert isqueue.run(["--json", "-j", array_id], env) == 0
    tasks = json.loads(capsys.readouterr().out)["jobs"]
    assert sorted(t["job_id"] for t in tasks) == [f"{array_id}_{i}" for i in range(3)]
    # The array's id is its first task's number, as Slurm's ArrayJobId
    assert array_id.isdigit() and parent.isdigit()
    first = min(tasks, key=lambda t: t["array_task_id"])
    assert first["job_number"] == int(array_id)
    assert isqueue.run(["--json", "-j", parent], env) == 0
    (parent_row,) = json.loads(capsys.readouterr().out)["jobs"]
    assert parent_row["job_id"] == parent
    spec = _spec_of(server, tasks[0]["isthmus_id"])
    assert spec["scheduling"]["dependencies"] == [{"kind": "afterok",
                                                   "jobs": [parent_row["isthmus_id"]]}]
    assert spec["env"]["SLURM_ARRAY_JOB_ID"] == array_id
    assert spec["scheduling"]["array"]["limit"] == 1
    assert _spec_of(server, parent)["env"]["LR"] == "0.1"
    assert iscancel.run([t["job_id"] for t in tasks] + [parent], env) == 0


def test_the_batch_call_refuses_what_isbatch_would_not_send(server: Server,
                                                           script: Path) -> None:
    import httpx

    from broker.sbatch.parse import parse

    parsed = parse([str(script)], {}, lambda path: SCRIPT)
    good = isbatch.client_body(parsed.request, parsed.script, str(script), {}, "/home/u")
    headers = {"Authorization": f"Bearer {TOKENS['vision']}"}
    for body in ({"script": "x"}, {"sbatch": {"job_name": "x"}, "script": "x"},
                 {"sbatch": {}, "script": "x", "shell": "rm -rf /"},
                 {**good, "sbatch": {**good["sbatch"], "partition": 5}},
                 {**good, "sbatch": {**good["sbatch"], "replicas": "2"}},
                 {**good, "extra": {**good["extra"], "output": 5}},
                 {**good, "extra": {**good["extra"], "cpus_per_gpu": "x"}}, [good]):
        r = httpx.post(f"{server.url}/v1/hpc/batch", json=body, headers=headers, timeout=30)
        assert r.status_code == 422, r.text


def _spec_of(server: Server, job_id: str) -> dict[str, Any]:
    import httpx

    r = httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30,
                  headers={"Authorization": f"Bearer {TOKENS['vision']}"})
    r.raise_for_status()
    spec: dict[str, object] = r.json()["spec"]
    return spec


def _into_closed_pipe(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a drop-in whose stdout is a pipe nobody reads any more (``| head`` that ended)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, env=env, stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60, check=False)
    finally:
        os.close(write_end)


def test_the_drop_ins_end_quietly_in_a_pipe_that_closed(server: Server, script: Path,
                                                         tmp_path: Path) -> None:
    """As Slurm's commands do: killed by SIGPIPE, nothing on stderr, no traceback."""
    env = {**env_for(server, "vision", tmp_path), "PATH": os.environ["PATH"]}
    bin_dir = ROOT / ".venv" / "bin"
    assert isbatch.run([str(script)], env) == 0
    for argv in (["isbatch", "--parsable", str(script)], ["isqueue"], ["isacct", "-X"],
                 ["iscancel", "--help"]):
        proc = _into_closed_pipe([str(bin_dir / argv[0]), *argv[1:]], env)
        assert proc.stderr == "", (argv, proc.stderr)
        assert proc.returncode == -13, argv  # SIGPIPE, as `sacct | head` ends sacct


def test_an_array_reads_as_slurm_shows_it(server: Server, script: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """One line ID_[0-5%2] while pending (one per task with -r); ARRAY_TASK is an id for
    squeue, sacct, scontrol, the jobs API and scancel; the array's id selects every task."""
    import httpx

    from broker.dropins import iscontrol

    env = env_for(server, "vision", tmp_path)
    assert isbatch.run(["--parsable", "--array=0-5%2", "-J", "sweep", str(script)], env) == 0
    array = capsys.readouterr().out.strip()
    assert isqueue.run(["-h", "-o", "%i %t %j", "-j", array], env) == 0
    assert capsys.readouterr().out.splitlines() == [f"{array}_[0-5%2] PD sweep"]
    assert isqueue.run(["-h", "-r", "-o", "%i|%A|%F|%K", "-j", array], env) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == [f"{array}_{i}" for i in range(6)]
    assert rows[0][1] == array and {r[2] for r in rows} == {array}
    assert [r[3] for r in rows] == [str(i) for i in range(6)]
    numbers = [r[1] for r in rows]
    assert all(n.isdigit() for n in numbers) and len(set(numbers)) == 6

    assert isacct.run(["-X", "-n", "-P", "-j", f"{array}_3,{numbers[4]}",
                       "-o", "JobID,JobIDRaw,JobName,State"], env) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{array}_3|{numbers[3]}|sweep|PENDING", f"{array}_4|{numbers[4]}|sweep|PENDING"]

    assert iscontrol.run(["show", "job", f"{array}_3"], env) == 0
    shown = capsys.readouterr().out
    assert f"JobId={numbers[3]} ArrayJobId={array} ArrayTaskId=3 JobName=sweep" in shown
    for key in ("JobState=PENDING", "NodeList=(null)", "ExitCode=0:0", "StdOut="):
        assert key in shown

    r = httpx.get(f"{server.url}/v1/jobs/{array}_3", timeout=30,
                  headers={"Authorization": f"Bearer {TOKENS['vision']}"})
    assert r.status_code == 200 and r.json()["number"] == int(numbers[3])

    assert iscancel.run([f"{array}_3"], env) == 0
    assert isacct.run(["-X", "-n", "-P", "-j", array, "-o", "JobID,State", "--state", "CA"],
                      env) == 0
    assert capsys.readouterr().out.splitlines() == [f"{array}_3|CANCELLED by 4294967294"]
    assert iscancel.run([array], env) == 0  # the array's id: every task left
    assert isqueue.run(["-h", "-j", array], env) == 0
    assert capsys.readouterr().out == ""


def test_the_batch_call_answers_bad_values_with_a_422_never_a_500(server: Server,
                                                                 script: Path) -> None:
    """Issue 34's eight causes of a 500 on POST /v1/hpc/batch, each now a 422 naming the
    problem (sbatch's own words where it has them); an array of fifty million tasks is
    counted, not built, so it costs the broker nothing."""
    import httpx

    from broker.sbatch.parse import parse

    parsed = parse([str(script)], {}, lambda path: SCRIPT)
    good = isbatch.client_body(parsed.request, parsed.script, str(script), {}, "/home/u")
    headers = {"Authorization": f"Bearer {TOKENS['vision']}"}
    bad = [{**good, "sbatch": {**good["sbatch"], "array": a}}
           for a in ("abc", "5-3", "0-10000", "0-50000000", "1-" + "9" * 5000)]
    bad += [{**good, "sbatch": {**good["sbatch"], "dependency": "bogus"}},
            {**good, "sbatch": {**good["sbatch"], "signal": "FOO"}},
            {**good, "extra": {**good["extra"], "begin": "garbage"}},
            {**good, "extra": {**good["extra"], "begin": "now+999999999week"}}]
    for body in bad:
        r = httpx.post(f"{server.url}/v1/hpc/batch", json=body, headers=headers, timeout=30)
        assert r.status_code == 422, (body["sbatch"], body["extra"], r.text)
    deep = httpx.post(f"{server.url}/v1/hpc/batch", content="[" * 100_000,
                      headers={**headers, "Content-Type": "application/json"}, timeout=30)
    assert deep.status_code in (413, 422), deep.text
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_a_script_over_the_body_limit_is_told_as_the_413_it_got(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34: a 21 MB script is refused by the broker's body limit (256 KiB by default);
    isbatch says so (the 413 and the limit), not "connection reset" or "broken pipe" (a 2 MB
    one was seen to end so on a busy machine), and submits nothing."""
    env = env_for(server, "vision", tmp_path)
    big = tmp_path / "big.sh"
    big.write_text(SCRIPT + ("# " + "x" * 98 + "\n") * 210_000)  # 21 MB
    for _ in range(3):  # the answer does not depend on how far the upload got
        assert isbatch.run([str(big)], env) == 1
        err = capsys.readouterr().err
        assert "HTTP 413" in err and "262144 bytes" in err, err
        assert "pipe" not in err.lower() and "reset" not in err.lower(), err
    assert isqueue.run(["-h", "-n", "pretrain", "-t", "all"], env) == 0
    assert "big" not in capsys.readouterr().out


def test_isinfo_shows_each_partitions_nodes_and_gpus(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sinfo -h -o "%P %D %G", which tools read for partitions and their GPUs: the nodes and
    GPUs a node of the pools each sbatch partition maps to (3 nodes of 8 here)."""
    from broker.dropins import isinfo

    env = env_for(server, "vision", tmp_path)
    assert isinfo.run(["-h", "-o", "%P %D %G"], env) == 0
    assert capsys.readouterr().out.splitlines() == ["a100* 3 gpu:a100:8", "h100 3 gpu:h100:8"]


def test_hold_and_release_as_sbatch_and_scontrol_do(
        server: Server, script: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """sbatch --hold stores the job held; scontrol release lets it go, hold holds it again;
    isqueue shows (JobHeldUser) as squeue does. Another team's id is an unknown one."""
    from broker.dropins import iscontrol

    env = env_for(server, "vision", tmp_path)
    assert isbatch.run(["--parsable", "--hold", str(script)], env) == 0
    number = capsys.readouterr().out.strip()

    def reason() -> str:
        assert isqueue.run(["-h", "-j", number, "-o", "%r"], env) == 0
        return capsys.readouterr().out.strip()

    assert reason() == "JobHeldUser"
    assert iscontrol.run(["release", number], env) == 0
    assert reason() == "WaitingForAdmission"
    assert iscontrol.run(["hold", number], env) == 0
    assert reason() == "JobHeldUser"
    other = env_for(server, "language", tmp_path)
    assert iscontrol.run(["release", number], other) == 1
    assert f"Invalid job id specified for job {number}" in capsys.readouterr().err
    assert reason() == "JobHeldUser"
    assert iscancel.run([number], env) == 0


def test_isqueue_partition_is_always_an_sbatch_partition(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job submitted through the API shows the sbatch partitions that offer its flavors, as
    squeue shows a job queued to several ("a100,h100"), not its flavors or a pool name."""
    import httpx

    body = {"name": "api-job", "team": "vision", "flavors": ["h100-80g", "a100-80g"],
            "gang": {"replicas": 1, "gpus_per_replica": 8}, "max_runtime": "1h",
            "entrypoint": {"command": ["python", "train.py"]}}
    r = httpx.post(f"{server.url}/v1/jobs", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {TOKENS['vision']}"})
    assert r.status_code == 201, r.text
    env = env_for(server, "vision", tmp_path)
    assert r.json()["state"] == "QUEUED", r.json()
    assert isqueue.run(["-h", "-j", str(r.json()["number"]), "-o", "%P"], env) == 0
    assert capsys.readouterr().out.strip() == "a100,h100"
