"""`isthmus db ...` errors name the database without its password (a URL from a secret)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from broker.cli.main import app
from broker.store.db import masked


@pytest.mark.parametrize("command", [["db", "check"], ["db", "rebuild-sums"], ["db", "upgrade"]])
def test_a_database_that_cannot_be_reached_is_named_without_its_password(
        command: list[str]) -> None:
    url = "postgresql://isthmus:s3cr3t-pw@127.0.0.1:1/isthmus"  # nothing listens on port 1
    out = CliRunner().invoke(app, [*command, "--db", url])
    assert out.exit_code == 2, out.output
    assert "s3cr3t-pw" not in out.output
    assert "postgresql://isthmus:***@127.0.0.1:1/isthmus" in out.output


def test_masked_keeps_urls_without_a_password_as_they_are() -> None:
    assert masked("sqlite:////var/lib/isthmus/isthmus.db") == "sqlite:////var/lib/isthmus/isthmus.db"
    assert masked("postgresql://isthmus@db/isthmus") == "postgresql://isthmus@db/isthmus"
    assert masked("postgresql://u:p/w@d@db:5432/x") == "postgresql://u:***@db:5432/x"
