"""A real `isthmus server` on the simulated federation (examples/isthmus.yaml) with token
sign-in, a small known workload, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import EXAMPLE_CONFIG
from tests.e2e.harness import ROOT, Server, wait_until

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


def _config(path: Path) -> Path:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["auth"] = {"mode": "token", "tokens": [
        {"name": "root", "role": "admin", "token_sha256": _sha(TOKENS["root"])},
        {"name": "alice", "team": "vision", "role": "user", "token_sha256": _sha(TOKENS["alice"])},
        {"name": "bob", "team": "language", "role": "user", "token_sha256": _sha(TOKENS["bob"])},
    ]}
    path.write_text(yaml.safe_dump(data))
    return path


def _spec(name: str) -> dict[str, Any]:
    found = next(JOBS.glob(f"*-{name}.yaml"))
    spec: dict[str, Any] = yaml.safe_load(found.read_text())
    return spec


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """bert-finetune (language) runs to SUCCEEDED on k8s-a100; too-big (vision) is REJECTED
    with ExceedsCapacity; later (vision) waits for its start time, a day away."""
    d = tmp_path_factory.mktemp("ui")
    server = Server(_config(d / "isthmus.yaml"), f"sqlite:///{d / 'ui.db'}", d / "server.log")
    server.start()
    fed = Federation(server)
    try:
        fed.submit(_spec("bert-finetune"), TOKENS["bob"])
        fed.submit(_spec("too-big"), TOKENS["alice"])
        later = _spec("too-big") | {
            "name": "later", "gang": {"replicas": 1, "gpus_per_replica": 8}, "topology": {},
            "scheduling": {"begin_at": (datetime.now(UTC) + timedelta(days=1)).isoformat()},
        }
        fed.submit(later, TOKENS["alice"])
        bert = fed.jobs["bert-finetune"]["id"]
        wait_until(lambda: fed.api(f"/v1/jobs/{bert}")["state"] == "SUCCEEDED", 180,
                   "bert-finetune to succeed")
        later_id = fed.jobs["later"]["id"]
        wait_until(lambda: fed.api(f"/v1/jobs/{later_id}")["reason"] == "BeginTimeNotReached",
                   60, "later to wait for its start time")
        yield fed
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: scripts/bootstrap installs Debian's chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield b
        finally:
            b.close()


class Console:
    """Console errors and uncaught exceptions of a page (CSP violations are console errors)."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    p = context.new_page()
    p.set_default_timeout(30_000)
    try:
        yield p
    finally:
        context.close()


def shot(page: Any, name: str, out: Path) -> None:
    """A screenshot of the visible page into `out`; into docs/screenshots too when
    ISTHMUS_UI_SCREENSHOTS=1 (how the README's screenshots are made)."""
    page.screenshot(path=str(out / f"{name}.png"))
    if os.environ.get("ISTHMUS_UI_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
