"""Submit a job from a template (the dashboard's one form that changes something).

The form posts here and the handler calls the API's own `routes_templates.submit_use` with the
signed-in caller, so every check, status and message is POST /v1/templates/{name}/jobs's; a
refusal shows the form again with the API's message and the field it names. Each override
is read as `isthmus submit --set PATH=VALUE` reads it (JSON when it parses, else text). The
form carries an idempotency key made when it was shown, so a double submit is one job; posts
from other sites are refused (the session cookie is SameSite=Strict, and the Origin is
checked as the sign-in form does).
"""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from broker.api.auth import Principal
from broker.api.problems import Problem
from broker.api.routes_templates import TemplateUse, submit_use, usable_templates
from broker.config_templates import MAX_OVERRIDES, JobTemplate, TemplateError, parse_override
from broker.ui.render import page
from broker.ui.session import same_origin, ui_principal

router = APIRouter(prefix="/ui", include_in_schema=False)
Caller = Annotated[Principal, Depends(ui_principal)]
MAX_FORM_FIELDS = MAX_OVERRIDES + 8
MAX_FORM_BYTES = 256 * 1024


def _current(template: JobTemplate, path: str) -> str:
    """The template's value at a dotted path, as the form shows it (JSON for non-text)."""
    here: Any = template.spec
    for key in path.split("."):
        if not isinstance(here, dict) or key not in here:
            return ""
        here = here[key]
    return here if isinstance(here, str) else json.dumps(here)


def _form(request: Request, caller: Principal, template: JobTemplate | None,
          status: int = 200, **context: Any) -> HTMLResponse:
    templates = usable_templates(request, caller)
    teams = [t.name for t in request.app.state.config.teams]
    defaults = {p: _current(template, p) for p in template.allow} if template else {}
    ctx: dict[str, Any] = {"job_name": "", "job_team": caller.team or "", "values": {},
                           "extra": "",
                           "error": "", "fields": [], **context}
    return page(request, caller, "submit.html", active="submit", status=status,
                templates=templates, template=template, teams=teams, defaults=defaults,
                key=secrets.token_urlsafe(18), **ctx)


@router.get("/submit", response_class=HTMLResponse)
def submit_form(request: Request, caller: Caller,
                template: Annotated[str | None, Query(max_length=63)] = None) -> Response:
    chosen = next((t for t in usable_templates(request, caller) if t.name == template), None)
    if template and chosen is None:
        return _form(request, caller, None, status=404,
                     error=f"no template {template!r} for your team")
    return _form(request, caller, chosen)


@router.post("/submit/{name}", response_class=HTMLResponse)
async def submit(name: str, request: Request, caller: Caller) -> Response:
    chosen = next((t for t in usable_templates(request, caller) if t.name == name), None)
    if chosen is None:
        return _form(request, caller, None, status=404,
                     error=f"no template {name!r} for your team")
    if not same_origin(request):
        return _form(request, caller, chosen, status=403,
                     error="Submit from this server's own form.")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return _form(request, caller, chosen, status=413, error="The form is too large.")
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=MAX_FORM_FIELDS)
    one = {k: v[0] for k, v in form.items()}
    values = {k.removeprefix("set."): v.strip() for k, v in one.items()
              if k.startswith("set.") and v.strip()}
    extra = one.get("extra", "")
    kept = {"job_name": one.get("name", ""), "job_team": one.get("team", ""), "values": values,
            "extra": extra}
    try:
        overrides = dict(parse_override(f"{path}={text}") for path, text in values.items()
                         if text != _current(chosen, path))
        overrides |= dict(parse_override(line.strip()) for line in extra.splitlines()
                          if line.strip())
        use = TemplateUse(name=kept["job_name"], team=kept["job_team"] or None, set=overrides)
        got = await submit_use(request, caller, name, use, one.get("key") or None)
    except TemplateError as exc:
        return _form(request, caller, chosen, status=422, error=str(exc),
                     fields=[exc.field], **kept)
    except ValidationError as exc:
        fields = [".".join(str(x) for x in e["loc"]) for e in exc.errors()]
        detail = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, exc.errors(), strict=True))
        return _form(request, caller, chosen, status=422, error=detail, fields=fields, **kept)
    except Problem as exc:
        fields = [str(e.get("field", "")) for e in (exc.errors or [])]
        return _form(request, caller, chosen, status=exc.status, error=exc.detail,
                     fields=fields, **kept)
    job_id = json.loads(bytes(got.body))["id"]
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
