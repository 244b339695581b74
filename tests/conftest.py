"""Shared fixtures. Every database test runs on SQLite and on a real PostgreSQL server.
`slow` and `ui` tests are left out of an ``-m`` selection that does not name them (the fast
tier), never out of the full suite: see tests/harness/tiers.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import IsthmusConfig, load_config
from broker.store import Database, open_database
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.tiers import left_out_by

_HERE = Path(__file__).parent
pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.workdir"] + [
    f"tests.fixtures.{name}"
    for name in ("slurm", "k8s")
    if (_HERE / "fixtures" / f"{name}.py").exists()
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the `slow` and `ui` tests of an ``-m`` that does not name them."""
    left_out = left_out_by(str(config.getoption("markexpr") or ""))
    if not left_out:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marked = {m.name for m in item.iter_markers()}
        (dropped if marked & left_out else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'isthmus.db'}"
    server = request.getfixturevalue("pg_server")
    template = request.getfixturevalue("pg_template")
    return str(server.url(server.new_database(template)))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_database(db_url, sqlite_synchronous="NORMAL")
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture
def example_config() -> IsthmusConfig:
    return load_config(EXAMPLE_CONFIG)
