"""`isthmus` reads the client file the HPC drop-ins read (~/.config/isthmus/client.yaml):
--server, then ISTHMUS_URL, then the file, then the local default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _isthmus(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    environ.update(HOME=str(home), COLUMNS="200", **env)
    environ.pop("XDG_CONFIG_HOME", None)
    return subprocess.run([sys.executable, "-m", "broker.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=environ)


def _client_file(home: Path, text: str, mode: int = 0o600) -> Path:
    path = home / ".config" / "isthmus" / "client.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_client_file_names_the_api(tmp_path: Path) -> None:
    _client_file(tmp_path, "url: http://127.0.0.1:9\ntoken: abc\n")
    out = _isthmus(tmp_path, "list")
    assert out.returncode == 2 and "http://127.0.0.1:9" in out.stderr, out.stderr
    assert "127.0.0.1:8080" not in out.stderr
    env_wins = _isthmus(tmp_path, "list", ISTHMUS_URL="http://127.0.0.1:7")
    assert env_wins.returncode == 2 and "http://127.0.0.1:7" in env_wins.stderr
    flag_wins = _isthmus(tmp_path, "list", "--server", "http://127.0.0.1:5")
    assert flag_wins.returncode == 2 and "http://127.0.0.1:5" in flag_wins.stderr


def test_a_token_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = _client_file(tmp_path, "url: http://127.0.0.1:9\ntoken: abc\n", mode=0o644)
    out = _isthmus(tmp_path, "list")
    told = "".join(out.stderr.split())  # the error console wraps long lines
    assert out.returncode == 2 and f"chmod600{path}" in told, out.stderr
