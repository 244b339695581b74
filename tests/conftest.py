"""Shared fixtures. Every database test runs on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import IsthmusConfig, load_config
from broker.store import Database, open_database
from tests.harness.paths import EXAMPLE_CONFIG

_HERE = Path(__file__).parent
pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.workdir"] + [
    f"tests.fixtures.{name}"
    for name in ("slurm", "k8s")
    if (_HERE / "fixtures" / f"{name}.py").exists()
]



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
