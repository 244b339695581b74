"""deploy/systemd units, checked by systemd itself: `systemd-analyze verify` in a scratch root
holding the units, the system's unit library and a stand-in for the installed isthmus, and
`systemd-analyze security` for the hardening."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.helm import REPO

UNITS = REPO / "deploy" / "systemd"
SERVICES = ("isthmus.service", "isthmus-standby.service")
INSTALLED = "/opt/isthmus/bin/isthmus"  # where docs/operations.md installs it


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("systemd-analyze") is None and os.geteuid() == 0:
        # a minimal Debian image may lack it; as root, fetch it like the testenv scripts do
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "systemd"],
                       capture_output=True, timeout=600, check=False,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert shutil.which("systemd-analyze"), (
        "systemd-analyze is missing (Debian package systemd): cannot check the units")
    root = tmp_path_factory.mktemp("root")
    lib = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
               if p.is_dir())
    shutil.copytree(lib, root / "usr/lib/systemd/system", symlinks=True)
    exe = root / INSTALLED.lstrip("/")
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in SERVICES:
        shutil.copy(UNITS / unit, root / "etc/systemd/system" / unit)
    return root


def _analyze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args, f"--root={root}"], capture_output=True,
                          text=True, timeout=120, check=False, cwd=root)


@pytest.mark.parametrize("unit", SERVICES)
def test_units_verify_without_a_warning(root: Path, unit: str) -> None:
    out = _analyze(root, "verify", "--man=no", f"/etc/systemd/system/{unit}")
    # verify exits 0 on unknown keys and bad values, printing a warning: any output fails
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout + out.stderr)


@pytest.mark.parametrize("unit", SERVICES)
def test_units_are_hardened(root: Path, unit: str) -> None:
    text = (UNITS / unit).read_text()
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "User=isthmus", "StateDirectory=isthmus",
                 "CapabilityBoundingSet=\n", "EnvironmentFile=/etc/isthmus/isthmus.env"):
        assert line in text, f"{unit}: {line.strip()} missing"
    out = _analyze(root, "security", "--offline=true", "--threshold=20", "--no-pager",
                   f"/etc/systemd/system/{unit}")
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout)
    assert level, out.stdout + out.stderr
    assert out.returncode == 0 and float(level.group(1)) <= 2.0, out.stdout


def test_the_env_file_names_what_the_server_reads() -> None:
    env = (UNITS / "isthmus.env").read_text()
    keys = set(re.findall(r"^#?([A-Z_]+)=", env, flags=re.M))
    assert {"ISTHMUS_DATABASE_URL", "ISTHMUS_ADMIN_TOKEN", "ISTHMUS_STANDBY_PORT"} <= keys
    sysusers = (UNITS / "isthmus.sysusers.conf").read_text()
    assert re.search(r"^u isthmus - ", sysusers, flags=re.M)
