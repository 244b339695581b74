"""A small Python client for the v1 API, on the standard library alone (used by the CLI and
the HPC drop-ins; usable from notebooks).

Every `isthmus` and drop-in command is one process with one or two calls, so its start-up is
most of what a user waits for: httpx and the pydantic models cost 0.25 s of imports on an idle
machine here and seconds on a loaded one (docs/benchmarks/hpc.md, 2026-12-01 wave 3; "CLI
start-up" in docs/benchmarks/history/2026-11-29..12-05.md). This client speaks JSON over one
keep-alive `http.client` connection and imports nothing else.
"""

from __future__ import annotations

import json
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any
from urllib.parse import quote, urlencode, urlsplit


class ApiError(Exception):
    """A problem+json answer (status >= 400), kept whole so callers can show the field errors."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(problem.get("detail") or problem.get("title") or f"HTTP {status}")


class TransportError(Exception):
    """The API could not be reached or answered something that is not HTTP/JSON."""


class Client:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"not an http(s) URL: {base_url!r}")
        kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        try:
            self._conn = kind(parts.hostname, parts.port, timeout=timeout)
        except ValueError as exc:  # a port out of range or not a number
            raise TransportError(f"{base_url!r}: {exc}") from None
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exchange(self, method: str, url: str, data: bytes | None,
                 headers: dict[str, str]) -> tuple[int, str, bytes]:
        """One request: status, reason phrase and body (the tests answer it in-process)."""
        try:
            self._conn.request(method, url, body=data, headers=headers)
            r = self._conn.getresponse()
            return r.status, r.reason, r.read()
        except (OSError, HTTPException) as exc:
            self._conn.close()
            raise TransportError(str(exc) or type(exc).__name__) from exc

    def raw(self, method: str, path: str, body: Any = None,
            params: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        url = self._prefix + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        sent = {**self._headers, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        status, reason, payload = self.exchange(method, url, data, sent)
        if status >= 400:
            raise _api_error(status, reason, payload)
        return status, reason, payload

    def call(self, method: str, path: str, body: Any = None,
             params: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
        """A JSON call; ApiError for a problem answer, TransportError when unreachable."""
        status, _reason, payload = self.raw(method, path, body, params, headers)
        try:
            return json.loads(payload) if payload else None
        except ValueError:
            raise TransportError(f"HTTP {status}: not JSON: {payload[:200]!r}") from None

    def text(self, path: str, params: dict[str, Any] | None = None) -> str:
        """A GET whose answer is text (a rendered script, a CSV report)."""
        return self.raw("GET", path, params=params)[2].decode(errors="replace")

    def _call(self, method: str, path: str, *, json: Any = None,
              params: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None) -> Any:
        return self.call(method, path, json, params, headers)

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        result: dict[str, Any] = self._call("POST", "/v1/jobs", json=spec, headers=headers)
        return result

    def submit_template(self, name: str, body: dict[str, Any],
                        idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        path = f"/v1/templates/{quote(name, safe='')}/jobs"
        result: dict[str, Any] = self._call("POST", path, json=body, headers=headers)
        return result

    def templates(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/templates")
        return result

    def batch(self, body: dict[str, Any]) -> dict[str, Any]:
        """isbatch's submission: POST /v1/hpc/batch (broker/orchestration/batch_submit.py)."""
        result: dict[str, Any] = self._call("POST", "/v1/hpc/batch", json=body)
        return result

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        """What admission would decide for `spec` now; nothing is created."""
        result: dict[str, Any] = self._call("POST", "/v1/plan", json=spec)
        return result

    def timeline(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}/timeline")
        return result

    def logs(self, job_id: str, attempt: int | None = None, rank: int | None = None,
             tail: int | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("attempt", attempt), ("rank", rank), ("tail", tail))
                  if v is not None}
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}")
        return result

    def jobs(
        self, team: str | None = None, states: list[str] | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", "/v1/jobs", params=_list_params(team, states, limit, cursor))
        return result

    def events(self, job_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/v1/jobs/{job_id}/events")
        return result

    def explain(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}/explain")
        return result

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/v1/jobs/{job_id}/attempts")
        return result

    def render(self, job_id: str, number: int) -> str:
        return self.text(f"/v1/jobs/{job_id}/attempts/{number}/render")

    def snapshot(self, job_id: str, number: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", f"/v1/jobs/{job_id}/attempts/{number}/snapshot")
        return result

    def signal(self, job_id: str, signal: str, whom: str = "steps") -> dict[str, Any]:
        """``whom``: steps (scancel's default), batch (``-b``) or full (``-f``)."""
        result: dict[str, Any] = self._call("POST", f"/v1/hpc/jobs/{job_id}/signal",
                                            json={"signal": signal, "whom": whom})
        return result

    def hold(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/hold")
        return result

    def release(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/release")
        return result

    def requeue(self, job_id: str, hold: bool = False) -> dict[str, Any]:
        query = "?hold=true" if hold else ""
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/requeue{query}")
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/cancel")
        return result

    def pools(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/admin/pools")
        return result

    def drain(self, pool: str, reason: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/v1/admin/pools/{pool}/drain", json={"reason": reason}
        )
        return result

    def undrain(self, pool: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/admin/pools/{pool}/undrain")
        return result

    def usage(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/admin/usage")
        return result

    def approve(self, job_id: str, note: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/v1/admin/jobs/{job_id}/approve", json={"note": note})
        return result

    def refuse(self, job_id: str, reason: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/v1/admin/jobs/{job_id}/refuse", json={"reason": reason})
        return result

    def approvals(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/admin/approvals")
        return result

    def notices(self, status: str | None = None, team: str | None = None,
                limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if team:
            params["team"] = team
        result: list[dict[str, Any]] = self._call("GET", "/v1/admin/notices", params=params)
        return result

    def retry_notice(self, delivery_id: int) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call(
            "POST", f"/v1/admin/notices/{delivery_id}/retry")
        return result

    def audit(self, actor: str | None = None, action: str | None = None,
              target: str | None = None, since: str | None = None, until: str | None = None,
              limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        """A page of the audit log, newest first: {"items", "next_cursor"}."""
        params = _audit_params(actor, action, target, since, until)
        params["limit"] = limit
        if cursor:
            params["cursor"] = cursor
        result: dict[str, Any] = self._call("GET", "/v1/admin/audit", params=params)
        return result

    def audit_export(self, actor: str | None = None, action: str | None = None,
                     target: str | None = None, since: str | None = None,
                     until: str | None = None) -> str:
        """Every matching audit record, oldest first, as JSON lines."""
        params = _audit_params(actor, action, target, since, until)
        params["format"] = "jsonl"
        return self.text("/v1/admin/audit", params=params)

    def budget_views(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/budgets")
        return result

    def queue_views(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/queues")
        return result

    def limit_views(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/limits")
        return result

    def pool_views(self) -> list[dict[str, Any]]:
        """Capacity, free, Isthmus vs foreign, queues, drain and reachability of every pool."""
        result: list[dict[str, Any]] = self._call("GET", "/v1/pools")
        return result

    def quota_views(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/quotas")
        return result

    def usage_report(self, start: str | None = None, end: str | None = None, by: str = "team",
                     fmt: str = "json") -> Any:
        """The usage report: a dict (fmt json) or the CSV text (fmt csv)."""
        params = {k: v for k, v in (("from", start), ("to", end), ("by", by), ("format", fmt))
                  if v is not None}
        if fmt == "json":
            return self._call("GET", "/v1/reports/usage", params=params)
        return self.text("/v1/reports/usage", params=params)

    def cycles(self, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if before is not None:
            params["before"] = before
        result: list[dict[str, Any]] = self._call("GET", "/v1/admin/cycles", params=params)
        return result

    def decisions(self, job_id: str, limit: int = 50,
                  before: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if before is not None:
            params["before"] = before
        result: list[dict[str, Any]] = self._call(
            "GET", f"/v1/jobs/{job_id}/decisions", params=params)
        return result

    def hpc_jobs(
        self, team: str | None = None, states: list[str] | None = None, limit: int = 500,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Jobs with their current run (nodes, exit code, start, end): the drop-ins' view."""
        result: dict[str, Any] = self._call(
            "GET", "/v1/hpc/jobs", params=_list_params(team, states, limit, cursor))
        return result

    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/hpc/whoami")
        return result

    def slurm_compat(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/hpc/slurm-compat")
        return result

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz")
        return result


def _api_error(status: int, reason: str, payload: bytes) -> ApiError:
    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"title": reason, "detail": payload[:500].decode(errors="replace")}
    return ApiError(status, body)


def _list_params(team: str | None, states: list[str] | None, limit: int,
                 cursor: str | None) -> dict[str, Any]:
    """Query parameters of the job listings (/v1/jobs and /v1/hpc/jobs) share one shape."""
    params: dict[str, Any] = {"limit": limit}
    if team:
        params["team"] = team
    if states:
        params["state"] = states
    if cursor:
        params["cursor"] = cursor
    return params


def _audit_params(actor: str | None, action: str | None, target: str | None,
                  since: str | None, until: str | None) -> dict[str, Any]:
    return {k: v for k, v in (("actor", actor), ("action", action), ("target", target),
                              ("since", since), ("until", until)) if v is not None}
