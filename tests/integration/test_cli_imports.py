"""The read commands start light: `isthmus list/status/explain` and `isqueue`, run against a
real server, import no HTTP framework, database layer or pydantic model of ours (issue 31:
start-up is most of what a user waits for; bench/cli_startup.py times it). Structural, not a
timing: the modules each run imported are read from `python -X importtime`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client
from tests.harness.paths import ROOT
from tests.harness.server import Server
from tests.harness.wait import wait_until

# Heavy for a one-call command: HTTP and server frameworks, the database layer, YAML, and our
# own pydantic models (the configuration, the job spec, the policies' explanation).
HEAVY = ("httpx", "fastapi", "starlette", "uvicorn", "sqlalchemy", "sqlmodel", "alembic",
         "yaml", "broker.config", "broker.domain.spec", "broker.store", "policies")
# isqueue is argparse over the client: not even pydantic. (`isthmus` runs on typer, which
# itself imports pydantic to coerce its parameters: "CLI start-up" in
# docs/benchmarks/history/2026-11-29..12-05.md.)
HEAVY_ISQUEUE = (*HEAVY, "pydantic", "typer", "rich")


def _imported(code: str, args: list[str], url: str, home: Path) -> set[str]:
    env = {**os.environ, "ISTHMUS_URL": url, "HOME": str(home)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def _heavy(modules: set[str], heavy: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, Path]]:
    tmp = tmp_path_factory.mktemp("cli-imports")
    server = Server(ROOT / "examples" / "isthmus.yaml", f"sqlite:///{tmp / 'db.sqlite'}",
                    tmp / "server.log").start()
    try:
        job_id = str(server.submit(json.loads(
            (ROOT / "examples" / "jobs" / "llama-ft.json").read_text()))["id"])
        with Client(server.url) as api:
            wait_until(lambda: api.explain(job_id)["text"], 60, "the job's explanation")
        yield server, job_id, tmp
    finally:
        server.stop()


CLI = "import sys; from broker.cli.main import app; sys.argv[0] = 'isthmus'; app()"
ISQUEUE = "import sys; from broker.dropins.isqueue import main; sys.argv[0] = 'isqueue'; main()"


@pytest.mark.parametrize("command", [["list"], ["status", "JOB"], ["explain", "JOB"]],
                         ids=lambda c: c[0])
def test_an_isthmus_read_command_imports_no_heavy_module(
        served: tuple[Server, str, Path], command: list[str]) -> None:
    server, job_id, home = served
    args = [job_id if a == "JOB" else a for a in command]
    modules = _imported(CLI, args, server.url, home)
    assert "broker.cli.main" in modules and "broker.client" in modules  # the reading works
    assert _heavy(modules, HEAVY) == []


def test_isqueue_imports_no_heavy_module(served: tuple[Server, str, Path]) -> None:
    server, _job_id, home = served
    modules = _imported(ISQUEUE, ["-t", "all"], server.url, home)
    assert "broker.dropins.isqueue" in modules
    assert _heavy(modules, HEAVY_ISQUEUE) == []
