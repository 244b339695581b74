"""deploy/container/Containerfile: read as instructions (always), and built with buildah and run
(deploy/container/build: a Debian base made with debootstrap when no registry is reachable;
RUN steps in chroot isolation)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.helm import REPO

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)

CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile"
BUILD = REPO / "deploy" / "container" / "build"
TAG = "test"
BUILD_TOOLS = ("gcc", "cc", "g++", "make", "pip", "pip3", "apt-get install")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    logical = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        word, _, rest = logical.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        logical = ""
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def test_the_containerfile_is_multi_stage_non_root_and_lean() -> None:
    build, final = stages(CONTAINERFILE.read_text())
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")  # same base: the venv's python matches
    kinds = dict(final)
    user = kinds["USER"]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"USER {user}: numeric and not root"
    assert json.loads(kinds["ENTRYPOINT"]) == ["isthmus"]
    assert kinds["HEALTHCHECK"].startswith("--interval=")
    assert "ISTHMUS_HEALTH_URL" in kinds["HEALTHCHECK"]
    assert "ISTHMUS_HEALTH_URL=http://127.0.0.1:8080/healthz" in kinds["ENV"]
    assert "PYTHONDONTWRITEBYTECODE=1" in kinds["ENV"]  # the chart's root fs is read-only
    # the final stage only copies the built venv and app in; nothing is installed there
    copies = [a for i, a in final if i == "COPY"]
    assert copies == ["--from=build /opt/isthmus /opt/isthmus",
                      "--from=build /opt/isthmus-app /opt/isthmus-app"]
    for ins, args in final:
        if ins == "RUN":
            assert not any(tool in args for tool in BUILD_TOOLS), args
    # the ports and user match the chart's defaults
    assert kinds["EXPOSE"] == "8080" and user.startswith("10001:")


# -- a real build ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image() -> str:
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(BUILD), TAG], capture_output=True, text=True,
                          timeout=1500, check=False)
    if proc.returncode != 0:
        pytest.fail(f"deploy/container/build exited {proc.returncode} after "
                    f"{time.monotonic() - t0:.0f}s\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)
    return proc.stdout.strip().splitlines()[-1].removeprefix("IMAGE=")


def _buildah(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"buildah {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"isthmus-test-{uuid.uuid4().hex[:8]}"
    _buildah("from", "--name", name, image)
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, timeout=60, check=False)


def _run(container: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", "run", "--isolation", "chroot", container, "--", *cmd],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_image_runs_isthmus_as_its_own_user_without_build_tools(
    image: str, container: str
) -> None:
    cfg = json.loads(_buildah("inspect", "--type", "image", image))["Docker"]["config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Entrypoint"] == ["isthmus"]
    assert cfg["Healthcheck"]["Test"][0] == "CMD"
    out = _run(container, "sh", "-c", "id -u; for t in gcc cc make pip pip3 g++ apt-get; do "
               "command -v $t >/dev/null && echo HAS $t; done; isthmus db upgrade "
               "--db sqlite:////tmp/t.db")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "10001"
    has = [line for line in lines if line.startswith("HAS ")]
    assert has in ([], ["HAS apt-get"]), has  # the base's apt-get, nothing to build with
    assert "database schema at revision" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_image_serves_and_its_healthcheck_passes(
    image: str, container: str, tmp_path: Path
) -> None:
    port = _free_port()
    conf = tmp_path / "isthmus.yaml"
    conf.write_text(f"server: {{host: 127.0.0.1, port: {port}}}\n"
                    "database: sqlite:////tmp/isthmus.db\nauth: {mode: none}\n")
    _buildah("copy", container, str(conf), "/tmp/isthmus.yaml")
    # chroot isolation shares the host's network: the server is reachable on the loopback
    server = subprocess.Popen(
        ["buildah", "run", "--isolation", "chroot", container, "--",
         "isthmus", "server", "--config", "/tmp/isthmus.yaml"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    health = json.load(r)
                break
            except OSError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline, "the server in the image did not answer"
                time.sleep(0.3)
        assert health["status"] == "ok" and health["control"] == "leader"
        # the image's own HEALTHCHECK command, pointed at this port
        cfg = json.loads(_buildah("inspect", "--type", "image", image))["Docker"]["config"]
        check = cfg["Healthcheck"]["Test"][1:]
        probe = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", "--env",
             f"ISTHMUS_HEALTH_URL=http://127.0.0.1:{port}/healthz", container, "--", *check],
            capture_output=True, text=True, timeout=60, check=False)
        assert probe.returncode == 0, probe.stderr
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
