"""Batch script rendering: directives from the spec and placement; user text only as data."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.base import Unsupported
from backends.slurm.script import LAUNCHER, RESERVED_ENV, RenderSettings, batch_job, render
from broker.domain.hostlist import expand
from tests.harness.requests import slurm_request

# (JobSpec strips surrounding whitespace, so the sample ends without a newline)
EVIL = "x'; rm -rf / #$(reboot)`id`\nISTHMUS_DATA_END\n'"


def _sbatch(script: str) -> dict[str, str]:
    opts = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            opts[key] = value
    return opts


def _data_blocks(script: str) -> list[bytes]:
    blocks = re.findall(r"base64 -d > \S+ <<'ISTHMUS_DATA_END'\n(.*?)\nISTHMUS_DATA_END",
                        script, re.S)
    return [base64.b64decode(b.replace("\n", "")) for b in blocks]


def test_gang_directives() -> None:
    opts = _sbatch(render(slurm_request(nodes=("a100-1", "a100-2")), partition="a100",
                          gpu_type="a100"))
    assert opts["--job-name"] == "isthmus-01abcdefghjkmnpq-2"
    assert opts["--comment"] == "isthmus,job=01abcdefghjkmnpq,attempt=2"
    assert opts["--partition"] == "a100"
    assert opts["--nodes"] == "2"
    assert opts["--ntasks"] == "2"
    assert opts["--ntasks-per-node"] == "1"
    assert opts["--gres"] == "gpu:a100:8"
    assert opts["--nodelist"] == "a100-1,a100-2"
    assert opts["--time"] == "90"
    assert opts["--signal"] == "B:USR1@45"
    assert "--no-requeue" in opts
    assert opts["--output"].startswith("/var/tmp/isthmus-slurm-jobs/isthmus-01abcdefghjkmnpq-2")
    assert "--switches" not in opts and "--gpus-per-task" not in opts


def test_rack_placement_asks_for_one_switch_and_named_nodes() -> None:
    req = slurm_request(level="rack", domain="spine/rack1", nodes=("a100-1", "a100-2"))
    opts = _sbatch(render(req, partition="a100", settings=RenderSettings(rack_features=True)))
    assert opts["--switches"] == "1"
    assert opts["--constraint"] == "rack1"
    assert opts["--nodelist"] == "a100-1,a100-2"


def test_gpus_per_node_form_and_untyped() -> None:
    settings = RenderSettings(gpu_request="gpus-per-node")
    opts = _sbatch(render(slurm_request(nodes=("a", "b")), partition="a100", settings=settings))
    assert opts["--gpus-per-node"] == "8" and "--gres" not in opts


def test_user_text_never_reaches_the_shell() -> None:
    req = slurm_request({"command": ["python", "-c", EVIL]}, env={"EVIL": EVIL})
    script = render(req, partition="a100")
    assert "rm -rf" not in script and "reboot" not in script
    (payload,) = _data_blocks(script)
    data = json.loads(payload)
    assert data["argv"] == ["python", "-c", EVIL]
    assert data["env"]["EVIL"] == EVIL and data["env"]["ISTHMUS_PROGRESS_TOKEN"] == "t0k"
    assert data["env"]["ISTHMUS_JOB_ID"] == "01abcdefghjkmnpq"


def test_script_entrypoint_is_its_own_file() -> None:
    user = "#!/bin/bash\necho hi $HOME\n" + EVIL
    script = render(slurm_request({"script": user}), partition="a100")
    payload, body = _data_blocks(script)
    assert json.loads(payload)["script"] == "user-script"
    assert body.decode() == user


def test_unsafe_values_are_refused() -> None:
    with pytest.raises(Unsupported, match="partition"):
        render(slurm_request(), partition="a100;reboot")
    with pytest.raises(Unsupported, match="node"):
        render(slurm_request(nodes=("a100-1", "$(x)")), partition="a100")
    with pytest.raises(ValueError, match="work_dir"):
        RenderSettings(work_dir="relative/dir")


def test_batch_job_fields_match_directives() -> None:
    job = batch_job(slurm_request(level="rack", domain="spine/rack2", nodes=("h1", "h2")),
                    RenderSettings(), partition="h100", gpu_type="h100")
    shape = job.shape
    assert (shape.nodes, shape.gpus_per_node, job.gpu_type, job.time_limit_min) == (
        2, 8, "h100", 90)
    assert job.rack == "rack2" and job.switches == 1 and job.signal == "B:USR1@45"


def test_launcher_execs_argv_with_env_and_rank(tmp_path: Path) -> None:
    """Rank 4 of 5, the second of three on the second node of 3 x 4 GPUs + 2 more nodes."""
    keys = [*RESERVED_ENV, "MASTER_PORT", "FOO"]
    spec = {"argv": [sys.executable, "-c", "import os, sys; print(' '.join(os.environ[k] "
                     "for k in sys.argv[1:]))", *keys],
            "env": {"FOO": "a b$c", "MASTER_ADDR": "user-set", "RANK": "9", "MASTER_PORT": "7"},
            "gpus_per_replica": 4}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {"SLURM_NODEID": "1", "SLURM_PROCID": "4", "SLURM_LOCALID": "1",
           "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_NUM_NODES": "3",
           "SLURM_STEP_TASKS_PER_NODE": "1,3(x2)", "ISTHMUS_MASTER_ADDR": "a100-1",
           "MASTER_PORT": "29500", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "job.json")],
                         capture_output=True, text=True, env=env, check=True).stdout
    got = dict(zip(keys, out.rstrip("\n").split(" ", len(keys) - 1), strict=True))
    assert got == {"MASTER_ADDR": "a100-1", "RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "1",
                   "LOCAL_WORLD_SIZE": "3", "NODE_RANK": "1", "NNODES": "3",
                   "GPUS_PER_NODE": "12", "MASTER_PORT": "7", "FOO": "a b$c"}


def test_the_batch_step_runs_where_sbatch_was_run(tmp_path: Path) -> None:
    """As Slurm runs a batch script in its submit directory (or --chdir): a workflow tool's
    rule writes its outputs relative to it (Snakemake's did land in the backend's work_dir).
    A directory the node does not have leaves the step where it is, saying so."""
    submit = tmp_path / "submit"
    submit.mkdir()
    (tmp_path / "launch.py").write_text(LAUNCHER)
    for where, expected in ((submit, str(submit)), (tmp_path / "gone", str(tmp_path))):
        spec = {"argv": [sys.executable, "-c", "import os; print(os.getcwd())"],
                "env": {"SLURM_SUBMIT_DIR": str(where)}, "gpus_per_replica": 1,
                "batch": True}
        (tmp_path / "job.json").write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, str(tmp_path / "launch.py"),
                               str(tmp_path / "job.json")], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, check=True)
        assert proc.stdout.strip() == expected
        assert ("couldn't chdir" in proc.stderr) == (expected != str(submit))


@pytest.mark.parametrize(("text", "names"), [
    ("a100-[1-2]", ("a100-1", "a100-2")),
    ("a100-[1-2],h100-3", ("a100-1", "a100-2", "h100-3")),
    ("n[01-03,7]", ("n01", "n02", "n03", "n7")),
    ("None assigned", ()),
    ("", ()),
])
def test_hostlist(text: str, names: tuple[str, ...]) -> None:
    assert expand(text) == names


@pytest.mark.parametrize(
    ("field", "update"),
    [
        pytest.param("max_runtime", {"max_runtime": 10**400}, id="max_runtime-10^400"),
        pytest.param("max_runtime", {"max_runtime": 60 * (2**32)}, id="max_runtime-2^32-min"),
        pytest.param("gang.memory_per_replica", {"memory_per_replica": 10**400},
                     id="memory-10^400"),
        pytest.param("gang.cpus_per_replica", {"cpus_per_replica": 10**30}, id="cpus-10^30"),
    ],
)
def test_values_slurm_cannot_hold_are_refused_not_overflowed(
    field: str, update: dict[str, int]
) -> None:
    request = slurm_request()
    spec = request.snapshot.spec
    gang = {k: v for k, v in update.items() if k != "max_runtime"}
    bad = spec.model_copy(update={k: v for k, v in update.items() if k == "max_runtime"}
                          | ({"gang": spec.gang.model_copy(update=gang)} if gang else {}))
    request = dataclasses.replace(
        request, snapshot=request.snapshot.model_copy(update={"spec": bad}))
    with pytest.raises(Unsupported, match=rf"^{re.escape(field)} is too large for Slurm"):
        batch_job(request, RenderSettings(), partition="a100")


def test_batch_options_of_an_array_task() -> None:
    """sbatch's --output/--error patterns: %j %x %A %a as the user knows them, Slurm's own
    patterns (%N, %u, %%) left to Slurm; --exclusive passed on."""
    entry: dict[str, object] = {"script": "#!/bin/bash\nsrun true", "launcher": "batch",
             "batch": {"output": "/w/%x_%A_%a_%j_%N_%%.out", "error": "/w/%u.err",
                       "exclusive": True}}
    array = {"array": {"id": "06harrayid000001", "index": 4, "count": 6}}
    opts = _sbatch(render(slurm_request(entry, scheduling=array), partition="a100"))
    assert opts["--output"] == "/w/train_06harrayid000001_4_01abcdefghjkmnpq_%N_%%.out"
    assert opts["--error"] == "/w/%u.err"
    assert "--exclusive" in opts
    plain = _sbatch(render(slurm_request({"script": "x", "launcher": "batch"}), partition="a100"))
    assert "--exclusive" not in plain and "--error" not in plain
    assert plain["--output"].startswith("/var/tmp/isthmus-slurm-jobs/")
