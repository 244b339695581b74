"""The API client of the drop-ins and the CLI, answered by an app in this process (no server)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from broker.client import Client


def clients_of(app: FastAPI) -> Callable[..., Client]:
    """A `Client` factory whose clients send their requests to `app`."""

    def local(url: str, token: str | None = None) -> Client:
        c = Client(url, token)
        c._http.close()
        c._http = TestClient(app)
        return c

    return local


def route_clients(monkeypatch: pytest.MonkeyPatch, module: ModuleType, app: FastAPI) -> None:
    """Make `module` (broker.hpc.common or broker.cli.common) build its clients over `app`."""
    monkeypatch.setattr(module, "Client", clients_of(app))
