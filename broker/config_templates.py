"""Job templates: vetted presets an admin offers (the `templates` section of isthmus.yaml).

A template is a partial job spec with a name, the teams that may use it (all when unset) and
the fields a user may change (`allow`, dotted paths: `gang.replicas`, `env` for every
variable, `max_runtime`). A user submits it with a job name, a team and overrides
(`POST /v1/templates/{name}/jobs`, `isthmus submit --template NAME --set gang.replicas=4`);
`fill` makes the spec, refusing an override outside `allow` with the field named, and the
result goes through every check a spec sent whole goes through. The job carries the
template's name in the annotation `template.isthmus.io/name`.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TEMPLATE_ANNOTATION = "template.isthmus.io/name"
MAX_OVERRIDES = 64
_PATH = r"^[a-z_][a-z0-9_]*(\.[A-Za-z0-9_-]+){0,4}$"
ALWAYS_GIVEN = frozenset({"name", "team"})
"""Set by the user on every use, whatever `allow` says."""


class TemplateError(ValueError):
    """An override the template does not allow, or one that does not fit: `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class JobTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    description: str = Field(default="", max_length=500)
    teams: list[str] | None = Field(
        default=None, description="teams that may use it (unset: every team)")
    spec: dict[str, Any] = Field(
        description="the job spec's fields this template sets (without name and team)")
    allow: list[str] = Field(
        default_factory=list, max_length=MAX_OVERRIDES,
        description="dotted paths a user may change (a path allows everything under it)")

    @model_validator(mode="after")
    def _check(self) -> JobTemplate:
        import re

        for i, path in enumerate(self.allow):
            if not re.match(_PATH, path):
                raise ValueError(f"allow[{i}]: {path!r} is not a dotted field path "
                                 "(e.g. gang.replicas)")
        given = sorted(ALWAYS_GIVEN & set(self.spec))
        if given:
            raise ValueError(f"spec: {given} are given by the user on every use; leave them "
                             "out of the template")
        return self

    def allows(self, path: str) -> bool:
        return path in ALWAYS_GIVEN or any(
            path == a or path.startswith(a + ".") for a in self.allow)

    def usable_by(self, team: str | None) -> bool:
        return self.teams is None or team is None or team in self.teams


def fill(template: JobTemplate, name: str, team: str,
         overrides: dict[str, Any]) -> dict[str, Any]:
    """The spec (as JSON data) of `template` used with this job name, team and overrides
    (dotted path -> value); TemplateError naming the first override it does not allow."""
    if len(overrides) > MAX_OVERRIDES:
        raise TemplateError("set", f"at most {MAX_OVERRIDES} overrides")
    spec = copy.deepcopy(template.spec)
    spec["name"], spec["team"] = name, team
    spec.setdefault("annotations", {})
    if not isinstance(spec["annotations"], dict):
        raise TemplateError("annotations", "the template's annotations are not a mapping")
    for path, value in overrides.items():
        if not isinstance(path, str) or not path:
            raise TemplateError("set", "each override is a dotted field path")
        if not template.allows(path):
            allowed = ", ".join(sorted(template.allow)) or "none"
            raise TemplateError(f"set.{path}", f"template {template.name} does not let users "
                                f"change {path} (allowed: {allowed})")
        _put(spec, path.split("."), value, path)
    spec["annotations"][TEMPLATE_ANNOTATION] = template.name
    return spec


def _put(spec: dict[str, Any], keys: list[str], value: Any, path: str) -> None:
    here = spec
    for key in keys[:-1]:
        nxt = here.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise TemplateError(f"set.{path}", f"{key} is not a mapping in the template")
        here = nxt
    here[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``path=value`` as the CLI's --set takes it: the value is JSON when it parses as JSON
    (numbers, true, lists, quoted strings), else the text itself; an environment variable's
    value is always its text (``env.LR=3e-4`` stays "3e-4")."""
    import json

    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise TemplateError("--set", f"{text!r}: give PATH=VALUE, e.g. gang.replicas=4")
    if path.strip().startswith("env."):
        return path.strip(), raw
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return path.strip(), value
