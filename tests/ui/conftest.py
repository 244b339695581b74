"""A real `isthmus server` on the simulated federation (examples/isthmus.yaml) with token
sign-in, a small known workload, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.harness.server import Server
from tests.harness.ui import CHROMIUM, TOKENS, Federation, demo_spec, ui_config
from tests.harness.wait import wait_until


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """bert-finetune (language) runs to SUCCEEDED on k8s-a100; too-big (vision) is REJECTED
    with ExceedsCapacity; later (vision) waits for its start time, a day away."""
    d = tmp_path_factory.mktemp("ui")
    server = Server(ui_config(d / "isthmus.yaml"), f"sqlite:///{d / 'ui.db'}", d / "server.log")
    server.start()
    fed = Federation(server)
    try:
        fed.submit(demo_spec("bert-finetune"), TOKENS["bob"])
        fed.submit(demo_spec("too-big"), TOKENS["alice"])
        later = demo_spec("too-big") | {
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


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    p = context.new_page()
    p.set_default_timeout(30_000)
    try:
        yield p
    finally:
        context.close()
