"""The web application as served: the REST API (broker.api) with the dashboard (broker.ui)
mounted at /ui. The API does not know the dashboard, which is a client of the API's
authentication and schemas; this module is where the two meet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from broker.api.app import create_app
from broker.config import IsthmusConfig
from broker.store.db import Database
from broker.ui import mount as mount_ui

if TYPE_CHECKING:
    from broker.control.runtime import Runtime


def build_app(config: IsthmusConfig, db: Database, runtime: Runtime | None = None) -> FastAPI:
    app = create_app(config, db, runtime)
    mount_ui(app)
    return app
