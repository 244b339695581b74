"""A started server, API worker or control process sets the garbage collector once
(broker.gc_settings): what start-up made frozen, young collections spaced out. These tests
run in the test process, so each puts the collector back as it was."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import gc_settings, logs
from broker.control.runtime import Runtime
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.server import free_port


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The collector as it was before the test, put back after it; the process's logging
    left alone (the entry points configure it: its handlers would stay for later tests)."""
    monkeypatch.setattr(logs, "configure", lambda *a, **k: None)
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_settle_freezes_what_exists_and_spaces_young_collections(collector: None) -> None:
    made = [[i] for i in range(1000)]  # containers made before the process settles
    _, middle, old = gc.get_threshold()
    gc_settings.settle()
    assert gc.get_threshold() == (gc_settings.YOUNG_EVERY, middle, old)
    assert gc.get_freeze_count() >= len(made)


def test_settled_puts_the_collector_back(collector: None) -> None:
    before = gc.get_threshold()
    with gc_settings.settled():
        assert gc.get_threshold()[0] == gc_settings.YOUNG_EVERY
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_server_settles_once_built_and_before_it_serves(
        collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import server

    seen: list[str] = []
    monkeypatch.setattr(gc_settings, "settle", lambda: seen.append("settle"))
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: seen.append("serve"))
    monkeypatch.setattr(Runtime, "start", lambda self: seen.append("loop"))
    monkeypatch.setattr(Runtime, "stop", lambda self: None)
    server.run(EXAMPLE_CONFIG, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", port=free_port())
    assert seen == ["settle", "loop", "serve"]


def test_an_api_worker_settles_once_its_app_is_built(
        collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import server_workers
    from broker.server import open_database

    seen: list[str] = []
    monkeypatch.setattr(gc_settings, "settle", lambda: seen.append("settle"))
    monkeypatch.setenv(server_workers.ENV, json.dumps({
        "config": str(EXAMPLE_CONFIG), "db": f"sqlite:///{tmp_path / 'db.sqlite'}",
        "host": "127.0.0.1", "port": free_port(), "control": False}))
    open_database(f"sqlite:///{tmp_path / 'db.sqlite'}")[0].dispose()  # the parent migrates
    app = server_workers.worker_app()
    assert seen == ["settle"]
    assert app.router.lifespan_context is not None
