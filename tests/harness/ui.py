"""The dashboard tests' pieces: the server's tokens and config, the known workload, the
browser console watcher and screenshots (fixtures are in tests/ui/conftest.py)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.harness.paths import EXAMPLE_CONFIG, ROOT
from tests.harness.server import Server

CHROMIUM = os.environ.get("ISTHMUS_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = ROOT / "docs" / "screenshots"
TOKENS = {"root": "ui-root-token", "alice": "ui-alice-token", "bob": "ui-bob-token"}
JOBS = ROOT / "examples" / "jobs" / "demo"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Federation:
    server: Server
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def api(self, path: str, token: str = TOKENS["root"]) -> Any:
        r = httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {token}"},
                      timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def submit(self, spec: dict[str, Any], token: str) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/v1/jobs", json=spec, timeout=30,
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        job: dict[str, Any] = r.json()
        self.jobs[job["name"]] = job
        return job


def ui_config(path: Path) -> Path:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {"mode": "token", "tokens": [
        {"name": "root", "role": "admin", "token_sha256": _sha(TOKENS["root"])},
        {"name": "alice", "team": "vision", "role": "user", "token_sha256": _sha(TOKENS["alice"])},
        {"name": "bob", "team": "language", "role": "user", "token_sha256": _sha(TOKENS["bob"])},
    ]}
    # what the submit form offers (bert-finetune's spec as a preset)
    preset = {k: v for k, v in demo_spec("bert-finetune").items() if k not in ("name", "team")}
    data["templates"] = [{"name": "bert-ft", "description": "BERT fine-tuning on one A100 node",
                          "spec": preset, "allow": ["gang.replicas", "env", "max_runtime"]}]
    path.write_text(yaml.safe_dump(data))
    return path


def demo_spec(name: str) -> dict[str, Any]:
    found = next(JOBS.glob(f"*-{name}.yaml"))
    spec: dict[str, Any] = yaml.safe_load(found.read_text())
    return spec


class Console:
    """Console errors and uncaught exceptions of a page (CSP violations are console errors)."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)


def shot(page: Any, name: str, out: Path) -> None:
    """A screenshot of the visible page into `out`; into docs/screenshots too when
    ISTHMUS_UI_SCREENSHOTS=1 (how the README's screenshots are made)."""
    page.screenshot(path=str(out / f"{name}.png"))
    if os.environ.get("ISTHMUS_UI_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
