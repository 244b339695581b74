"""`isthmus db upgrade`, as the chart's hook Job and the systemd unit run it: the database URL
from ISTHMUS_DATABASE_URL, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.store.migrate import _SCRIPTS

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)


def _head() -> str:
    heads = sorted(p.name.split("_", 1)[0] for p in (_SCRIPTS / "versions").glob("0*.py"))
    return heads[-1]


def _upgrade(env_url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ISTHMUS_DATABASE_URL"}
    if env_url is not None:
        env["ISTHMUS_DATABASE_URL"] = env_url
    return subprocess.run([sys.executable, "-m", "broker.cli.main", "db", "upgrade", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_db_upgrade_migrates_an_empty_database_named_by_the_env(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        url = str(server.url(server.new_database()))  # empty: no template
    for _ in range(2):  # and again: nothing to do the second time
        out = _upgrade(url)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"database schema at revision {_head()}" in out.stdout
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        assert "jobs" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_db_upgrade_without_a_database_says_how_to_name_one() -> None:
    out = _upgrade(None)
    assert out.returncode == 2
    assert "ISTHMUS_DATABASE_URL" in out.stdout + out.stderr
