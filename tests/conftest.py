"""Shared fixtures. Every database test runs on SQLite and on a real PostgreSQL server.
`slow` and `ui` tests are left out of an ``-m`` selection that does not name them (the fast
tier), never out of the full suite: see tests/harness/tiers.py."""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config import IsthmusConfig, parse_config
from broker.store import Database, open_database
from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.tiers import CLUSTER_GROUP, left_out_by, on_local_cluster

_HERE = Path(__file__).parent
pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.workdir",
                  "tests.fixtures.log_config", "tests.fixtures.oci_registry"] + [
    f"tests.fixtures.{name}"
    for name in ("slurm", "k8s")
    if (_HERE / "fixtures" / f"{name}.py").exists()
]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts every test of the local clusters in one xdist group; deselects the `slow` and `ui`
    tests of an ``-m`` that does not name them."""
    for item in items:
        if on_local_cluster(item):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))
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
    """SQLite: a path where no database exists yet. PostgreSQL: a fresh clone of the migrated
    template database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'isthmus.db'}"
    server = request.getfixturevalue("pg_server")
    template = request.getfixturevalue("pg_template")
    return str(server.url(server.new_database(template)))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session; `db` copies it instead of running every
    migration again for each test (as PostgreSQL clones `pg_template`)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "isthmus.db"
    open_database(f"sqlite:///{path}").dispose()
    return path


def _copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent copy through SQLite's backup API (whatever is still in the WAL)."""
    with sqlite3.connect(src) as source, sqlite3.connect(dst) as target:
        source.backup(target)
    source.close()
    target.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database without any schema (not the migrated template the db fixture clones), on
    each database: for the migrations' own tests."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    server = request.getfixturevalue("pg_server")
    return str(server.url(server.new_database()))


@pytest.fixture
def db(db_url: str, request: pytest.FixtureRequest) -> Iterator[Database]:
    """The database of `db_url`, migrated. An empty SQLite path starts as a copy of the
    migrated template; `open_database` then checks it is at the newest revision."""
    if db_url.startswith("sqlite:///"):
        path = Path(db_url.removeprefix("sqlite:///"))
        if not path.exists():
            _copy_sqlite(request.getfixturevalue("sqlite_template"), path)
    database = open_database(db_url, sqlite_synchronous="NORMAL")
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture(scope="session")
def _example_config_data() -> dict[str, Any]:
    """examples/isthmus.yaml read and parsed once (PyYAML's pure-Python loader takes tens of
    milliseconds per read, and over a hundred tests ask for the example)."""
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture
def example_config(_example_config_data: dict[str, Any]) -> IsthmusConfig:
    """A fresh `IsthmusConfig` of examples/isthmus.yaml for each test, validated as
    `load_config` does, from a copy of the YAML read once."""
    return parse_config(copy.deepcopy(_example_config_data), str(EXAMPLE_CONFIG))
