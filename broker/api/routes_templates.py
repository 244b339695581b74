"""/v1/templates: the job presets an admin offers (isthmus.yaml `templates`), listed for the
caller's team and submitted with a job name, a team and the overrides each allows
(broker/config_templates.py). A job from a template goes through every check and the same
group commit as one sent whole to POST /v1/jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.api.auth import Principal, principal
from broker.api.guards import idempotency_key
from broker.api.problems import Problem, invalid_spec, problem_responses
from broker.api.routes_jobs import allowed_spec, submit_checked
from broker.config import IsthmusConfig
from broker.config_templates import MAX_OVERRIDES, JobTemplate, TemplateError, fill
from broker.domain.spec import JobSpec

router = APIRouter(prefix="/v1/templates", tags=["templates"],
                   responses=problem_responses(401, 422))
Caller = Annotated[Principal, Depends(principal)]


class TemplateOut(BaseModel):
    name: str
    description: str
    teams: list[str] | None
    spec: dict[str, Any]
    allow: list[str]

    @classmethod
    def of(cls, t: JobTemplate) -> TemplateOut:
        return cls(name=t.name, description=t.description, teams=t.teams, spec=t.spec,
                   allow=t.allow)


class TemplateUse(BaseModel):
    """A template's use: the job's name and team (the caller's own when unset) and the
    overrides, dotted path -> value (each must be allowed by the template)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=63)
    team: str | None = Field(default=None, max_length=63)
    set: dict[str, Any] = Field(default_factory=dict, max_length=MAX_OVERRIDES)


def _config(request: Request) -> IsthmusConfig:
    config: IsthmusConfig = request.app.state.config
    return config


def usable_templates(request: Request, caller: Principal) -> list[JobTemplate]:
    """The templates the caller's team may use (an admin: every one)."""
    return [t for t in _config(request).templates if caller.is_admin or t.usable_by(caller.team)]


def _usable(request: Request, caller: Principal, name: str) -> JobTemplate:
    """The template, if the caller's team may use it; another team's is answered like an
    unknown one (404)."""
    template = _config(request).template(name)
    if template is None or not (caller.is_admin or template.usable_by(caller.team)):
        raise Problem(404, "not-found", "No such template",
                      f"no template {name!r} for your team (GET /v1/templates lists them)")
    return template


@router.get("", response_model=list[TemplateOut])
def list_templates(request: Request, caller: Caller) -> list[TemplateOut]:
    """The templates the caller's team may use (an admin: every one)."""
    return [TemplateOut.of(t) for t in usable_templates(request, caller)]


@router.post(
    "/{name}/jobs", status_code=201,
    responses={200: {"description": "replay of an idempotent submission"},
               **problem_responses(400, 403, 404, 409, 429)},
)
async def submit_from_template(
    name: str, use: TemplateUse, request: Request, caller: Caller,
    key: Annotated[str | None, Depends(idempotency_key)],
) -> Response:
    """Submit a job from a template: 422 naming an override the template does not allow or
    a field the result gets wrong, 403 for another team, 404 for a template the caller's
    team may not use."""
    return await submit_use(request, caller, name, use, key)


async def submit_use(request: Request, caller: Principal, name: str, use: TemplateUse,
                     key: str | None) -> Response:
    """POST /v1/templates/{name}/jobs for this caller (also the dashboard's submit form):
    the job's response, or a Problem."""
    template = _usable(request, caller, name)
    team = use.team or caller.team
    if team is None:
        raise Problem(422, "invalid-spec", "Invalid job spec",
                      "team: give the job's team (your token has none)",
                      [{"field": "team", "message": "give the job's team"}])
    if not caller.is_admin and not template.usable_by(team):
        raise Problem(403, "forbidden-team", "Not for this team",
                      f"template {name} is not offered to team {team}")
    try:
        data = fill(template, use.name, team, use.set)
    except TemplateError as exc:
        raise Problem(422, "invalid-spec", "Invalid job spec", str(exc),
                      [{"field": exc.field, "message": exc.message}]) from None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid_spec(exc) from None
    return await submit_checked(request, caller, allowed_spec(request, caller, spec), key)
