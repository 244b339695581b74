"""isbatch starts light (its start-up is part of every submission's latency) and its own HTTP
client reports the broker's refusals and an unreachable broker as sbatch-style errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.dropins import isbatch
from tests.harness.paths import ROOT
from tests.harness.server import free_port

HEAVY = ("httpx", "pydantic", "yaml", "broker.domain.spec", "sqlalchemy", "rich")


def test_the_isbatch_entry_point_imports_no_heavy_module() -> None:
    code = ("import json, sys; import broker.dropins.isbatch; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=120).stdout
    assert json.loads(out) == []


def test_an_unreachable_broker_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 1\n#SBATCH --gres=gpu:1\nsrun true\n")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert isbatch.run([str(script)], {"ISTHMUS_URL": url, "HOME": str(tmp_path)}) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"isbatch: error: cannot reach the Isthmus broker at {url}: "), err


def test_a_refusal_of_the_broker_is_shown_with_its_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that requires tokens answers 401 to none: the problem's text and the status."""
    import hashlib

    from tests.harness.server import Server, write_config

    token = {"name": "u", "team": "vision",
             "token_sha256": hashlib.sha256(b"right-token").hexdigest()}
    cfg = write_config(tmp_path / "isthmus.yaml", [], [], control={"enabled": False},
                       auth={"mode": "token", "tokens": [token]},
                       slurm_compat={"partitions": {"a100": {"flavors": ["a100-80g"]}}})
    server = Server(cfg, f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "server.log").start()
    try:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\n#SBATCH -N 1\n#SBATCH --gres=gpu:1\nsrun true\n")
        env = {"ISTHMUS_URL": server.url, "ISTHMUS_TOKEN": "wrong-token", "HOME": str(tmp_path)}
        assert isbatch.run([str(script)], env) == 1
        err = capsys.readouterr().err
        assert err.startswith("isbatch: error: ") and err.rstrip().endswith("(HTTP 401)"), err
        env["ISTHMUS_TOKEN"] = "right-token"
        assert isbatch.run(["--parsable", "-p", "a100", str(script)], env) == 0
        assert capsys.readouterr().out.strip()
    finally:
        server.stop()
