"""The HTTP client of isbatch, on the standard library alone.

isbatch runs once per submission, so its start-up is part of every job's latency: importing
httpx and the pydantic models costs 0.25 s on an idle machine here and seconds on a loaded one
(docs/benchmarks/hpc.md). This client speaks the few v1 calls isbatch makes over one
keep-alive `http.client` connection and imports nothing else.
"""

from __future__ import annotations

import json
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any
from urllib.parse import urlencode, urlsplit


class ApiError(Exception):
    """A problem+json answer (status >= 400), kept whole."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(problem.get("detail") or problem.get("title") or f"HTTP {status}")


class TransportError(Exception):
    """The broker could not be reached or answered something that is not HTTP/JSON."""


class ThinClient:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"not an http(s) URL: {base_url!r}")
        kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        self._conn = kind(parts.hostname, parts.port, timeout=timeout)
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ThinClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, body: Any = None,
             params: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
        url = self._prefix + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        sent = {**self._headers, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        try:
            self._conn.request(method, url, body=data, headers=sent)
            r = self._conn.getresponse()
            raw = r.read()
        except (OSError, HTTPException) as exc:
            self._conn.close()
            raise TransportError(str(exc) or type(exc).__name__) from exc
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
            if r.status < 400:
                raise TransportError(f"HTTP {r.status}: not JSON: {raw[:200]!r}") from None
        if r.status >= 400:
            problem = answer if isinstance(answer, dict) else {
                "title": r.reason, "detail": raw[:500].decode(errors="replace")}
            raise ApiError(r.status, problem)
        return answer

    def slurm_compat(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", "/v1/hpc/slurm-compat")
        return result

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: dict[str, Any] = self.call("POST", "/v1/jobs", spec, headers=headers)
        return result

    def batch(self, body: dict[str, Any]) -> dict[str, Any]:
        """isbatch's submission: POST /v1/hpc/batch (broker/hpc/batch_submit.py)."""
        result: dict[str, Any] = self.call("POST", "/v1/hpc/batch", body)
        return result

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call("POST", "/v1/plan", spec)
        return result

    def hpc_jobs(self, team: str | None = None, states: list[str] | None = None,
                 limit: int = 500, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("team", team), ("state", states), ("cursor", cursor)):
            if value:
                params[key] = value
        result: dict[str, Any] = self.call("GET", "/v1/hpc/jobs", params=params)
        return result
