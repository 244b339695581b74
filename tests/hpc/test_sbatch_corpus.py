"""isbatch --parse-only --json over the corpus: every script gives the expected request, every
bad one exits non-zero naming the option, as sbatch does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from broker.dropins.isbatch import run
from tests.hpc.corpus_cases import Case, cases

ALL = cases()


def test_corpus_is_large_enough() -> None:
    assert len([c for c in ALL if c.script]) >= 40


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_parse_only(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["--parse-only", "--json", *case.argv("4242")], case.env)
    out, err = capsys.readouterr()
    if case.error is not None:
        assert code == case.exit, out
        assert case.error in err
        assert out == ""
        return
    assert code == 0, err
    got = json.loads(out)["sbatch"]
    assert set(got) == {
        "job_name", "partition", "replicas", "gpus_per_node", "gpu_type", "time_limit_s",
        "cpus_per_task", "mem_mb", "array", "dependency", "signal", "constraint", "account",
        "qos", "exclusive", "wrap",
    }
    for key, value in case.expected("4242").items():
        assert got[key] == value, key


def test_console_script_runs_without_a_server(tmp_path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2 --gres=gpu:h100:8 -t 1-0\nsrun hostname\n")
    proc = subprocess.run(
        [sys.executable, "-c", "from broker.dropins.isbatch import main; main()",
         "--parse-only", "--json", str(script)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["sbatch"]
    assert (got["replicas"], got["gpus_per_node"], got["gpu_type"], got["time_limit_s"]) == (
        2, 8, "h100", 86400)


@pytest.mark.parametrize(
    ("argv", "env", "key", "value"),
    [
        (["-t", "45"], {"SBATCH_TIMELIMIT": "20"}, "time_limit_s", 2700),
        ([], {"SBATCH_TIMELIMIT": "20"}, "time_limit_s", 1200),
        (["--qos=high"], {"SBATCH_QOS": "low"}, "qos", "high"),
        (["--exclusive"], {}, "exclusive", True),
        (["-G", "h100:16", "-N", "2"], {}, "gpus_per_node", 8),
        (["--gpus=16", "--ntasks=16", "--ntasks-per-node=8"], {}, "replicas", 2),
    ],
    ids=["cli-over-env", "env-over-script", "qos-cli", "exclusive-bare", "gpus-total",
         "ntasks-derive-nodes"],
)
def test_precedence_and_derivation(
    argv: list[str], env: dict[str, str], key: str, value: object, tmp_path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/bash\n#SBATCH -t 10 --qos=normal\nhostname\n")
    assert run(["--parse-only", "--json", *argv, str(script)], env) == 0
    assert json.loads(capsys.readouterr().out)["sbatch"][key] == value
