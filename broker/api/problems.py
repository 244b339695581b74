"""RFC 9457 problem details: every client error names the field and what to do about it."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.headers = headers

    def response(self, instance: str | None = None) -> JSONResponse:
        body: dict[str, Any] = {
            "type": f"urn:isthmus:problem:{self.slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        if self.errors:
            body["errors"] = self.errors
        return JSONResponse(
            body, status_code=self.status, media_type=PROBLEM_JSON, headers=self.headers
        )


def field_errors(exc: ValidationError, prefix: str = "") -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        elif err["type"] == "missing":
            msg = "required field is missing"
        out.append({"field": f"{prefix}{loc}" or "(body)", "message": msg})
    return out


def invalid_spec(exc: ValidationError) -> Problem:
    errors = field_errors(exc)
    if any(e["type"] == "json_invalid" for e in exc.errors()):
        first = exc.errors()[0]
        return Problem(
            400, "malformed-json", "Malformed JSON",
            f"the body is not valid JSON: {first['msg']}",
            [{"field": "(body)", "message": str(first.get("ctx", {}).get("error", first["msg"]))}],
        )
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return Problem(422, "invalid-spec", "Invalid job spec", summary, errors)


class FieldError(BaseModel):
    field: str
    message: str


class ProblemBody(BaseModel):
    """The body of every 4xx and 5xx answer (RFC 9457), as documented in the OpenAPI."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] = []


_WHEN = {
    400: "malformed request (JSON, header)",
    401: "missing or unknown bearer token",
    403: "not allowed for this token (another team, not an admin)",
    404: "not found (or another team's job)",
    409: "conflicts with the current state",
    413: "request body too large",
    415: "not application/json",
    422: "invalid input; `errors` names each field and the limit",
    429: "a concurrency limit (queued jobs per team or user) is reached; `errors` names it",
    503: "a backend this needs cannot be reached from this server now",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these problem statuses (for a route decorator)."""
    return {
        status: {
            "description": _WHEN[status],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
