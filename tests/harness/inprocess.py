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
        return over_app(Client(url, token), TestClient(app))

    return local


def over_app(client: Client, http: TestClient) -> Client:
    """`client`, its requests answered by the app behind `http` instead of a socket."""

    def exchange(method: str, url: str, data: bytes | None,
                 headers: dict[str, str]) -> tuple[int, str, bytes]:
        r = http.request(method, url, content=data, headers=headers)
        return r.status_code, r.reason_phrase, r.content

    client.exchange = exchange  # type: ignore[method-assign]
    return client


def route_clients(monkeypatch: pytest.MonkeyPatch, module: ModuleType, app: FastAPI) -> None:
    """Make `module` (broker.dropins.common or broker.cli.common) build its clients over `app`."""
    monkeypatch.setattr(module, "Client", clients_of(app))
