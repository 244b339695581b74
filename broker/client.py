"""A small Python client for the v1 API (used by the CLI; usable from notebooks)."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """A problem+json answer, kept whole so callers can show the field errors."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(problem.get("detail") or problem.get("title") or f"HTTP {status}")


class Client:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self._http.request(method, path, **kw)
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"title": r.reason_phrase, "detail": r.text[:500]}
            raise ApiError(r.status_code, body if isinstance(body, dict) else {"detail": body})
        return r.json()

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        result: dict[str, Any] = self._call("POST", "/v1/jobs", json=spec, headers=headers)
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
        r = self._http.get(f"/v1/jobs/{job_id}/attempts/{number}/render")
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"title": r.reason_phrase, "detail": r.text[:500]}
            raise ApiError(r.status_code, body if isinstance(body, dict) else {"detail": body})
        return r.text

    def snapshot(self, job_id: str, number: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", f"/v1/jobs/{job_id}/attempts/{number}/snapshot")
        return result

    def signal(self, job_id: str, signal: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/hpc/jobs/{job_id}/signal",
                                            json={"signal": signal})
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
        r = self._http.get("/v1/reports/usage", params=params)
        if r.status_code >= 400:
            raise _api_error(r)
        return r.text

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


def _api_error(r: httpx.Response) -> ApiError:
    try:
        body = r.json()
    except ValueError:
        body = {"title": r.reason_phrase, "detail": r.text[:500]}
    return ApiError(r.status_code, body if isinstance(body, dict) else {"detail": body})


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
