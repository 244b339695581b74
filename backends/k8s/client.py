"""Talking to the API server: lazy client construction, raw JSON calls, error translation.

The ``kubernetes`` package is imported only inside these functions, so importing the backend
never touches it (nor the network). Calls return the API's JSON as dicts (``_preload_content``
off): building client model objects for thousands of pods costs more than the rest of a
reconcile pass. An unreachable or overloaded API server becomes `BackendUnavailable`; 4xx
answers stay `ApiError` for the caller to handle (404, 409, 410).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from backends.base import BackendUnavailable
from backends.k8s.settings import K8sSettings

UNAVAILABLE_STATUS = frozenset({0, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """A 4xx answer of the API server: status and the server's message."""

    def __init__(self, status: int, reason: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body or {}


def new_api_client(settings: K8sSettings) -> Any:
    """A ``kubernetes.client.ApiClient`` from the kubeconfig (or the in-cluster config)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    kubeconfig = settings.kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    try:
        if kubeconfig or default.exists():
            return config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or str(default), context=settings.context,
                persist_config=False,
            )
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    except (ConfigException, OSError) as exc:
        raise BackendUnavailable(f"kubernetes client configuration: {exc}") from None


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Map transport failures and 5xx to BackendUnavailable, other HTTP errors to ApiError."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        if status in UNAVAILABLE_STATUS:
            raise BackendUnavailable(f"{what}: API server answered {status} {exc.reason}") \
                from None
        body: dict[str, Any] = {}
        try:
            body = json.loads(exc.body) if exc.body else {}
        except (TypeError, ValueError):
            body = {}
        raise ApiError(status, str(body.get("message") or exc.reason), body) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise BackendUnavailable(f"{what}: API server unreachable ({exc})") from None


def call_json(what: str, method: Callable[..., Any], *args: Any, timeout: float,
              **kwargs: Any) -> dict[str, Any]:
    """Call a generated client method and return the JSON body as a dict."""
    with translated(what):
        resp = method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
        data = resp.data
    result = json.loads(data) if data else {}
    return result if isinstance(result, dict) else {}


def call(what: str, method: Callable[..., Any], *args: Any, timeout: float,
         **kwargs: Any) -> None:
    """Call a generated client method for its effect (create/patch/delete)."""
    with translated(what):
        method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)


class Apis:
    """The typed API groups over one ApiClient, created on first use."""

    def __init__(self, settings: K8sSettings, api_client: Any | None = None) -> None:
        self.settings = settings
        self._api_client = api_client
        self._core: Any = None
        self._batch: Any = None
        self._custom: Any = None

    @property
    def api_client(self) -> Any:
        if self._api_client is None:
            self._api_client = new_api_client(self.settings)
        return self._api_client

    @property
    def core(self) -> Any:
        if self._core is None:
            from kubernetes import client

            self._core = client.CoreV1Api(self.api_client)
        return self._core

    @property
    def batch(self) -> Any:
        if self._batch is None:
            from kubernetes import client

            self._batch = client.BatchV1Api(self.api_client)
        return self._batch

    @property
    def custom(self) -> Any:
        if self._custom is None:
            from kubernetes import client

            self._custom = client.CustomObjectsApi(self.api_client)
        return self._custom

    def close(self) -> None:
        if self._api_client is not None:
            self._api_client.close()
