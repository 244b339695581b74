"""broker.logs.configure: the broker's lines and the migrations a start runs are told, not
alembic's list of the plugins it sets up (seven INFO lines on every start, even a refused one)."""

from __future__ import annotations

import io
import logging

from broker.logs import configure, get_logger


def test_alembic_plugin_lines_are_quiet_and_migrations_and_broker_lines_are_told() -> None:
    stream = io.StringIO()
    handler = configure(logging.INFO, stream)
    try:
        logging.getLogger("alembic.runtime.plugins").info("setup plugin alembic.autogenerate.x")
        logging.getLogger("alembic.runtime.migration").info("Running upgrade 0011 -> 0012")
        get_logger("broker.server").info("isthmus listening")
    finally:
        logging.getLogger().removeHandler(handler)
    out = stream.getvalue()
    assert "setup plugin" not in out
    assert "Running upgrade 0011 -> 0012" in out and "isthmus listening" in out
