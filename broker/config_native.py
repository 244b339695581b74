"""The native-options policy of a team (`teams[].native` in isthmus.yaml) and the check of a
job's `native:` block against it at submit (broker/domain/native.py holds what can ever pass).

    teams:
      - name: vision
        native:
          k8s: {pod_template: [spec.tolerations, spec.priorityClassName, metadata.labels]}
          slurm: {options: [--qos, --constraint]}

A team without `native` may pass nothing; a field or option outside its lists is refused at
submit (422) naming it and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, Field

from broker.config_tuning import Strict
from broker.domain import metadata_keys
from broker.domain.native import (
    ENFORCED_POD_FIELDS,
    ENFORCED_SLURM_OPTIONS,
    POD_TEMPLATE_FIELDS,
    SLURM_OPTIONS,
    NativeOptions,
    NativeProblem,
    overlay_fields,
    slurm_option,
)


def _pod_field(path: str) -> str:
    if path not in POD_TEMPLATE_FIELDS:
        why = ENFORCED_POD_FIELDS.get(path)
        kept = (f"Isthmus enforces it ({why}) and no overlay may change it" if why
                else "not a field an overlay may add to")
        raise ValueError(f"'{path}': {kept}; choose among {', '.join(POD_TEMPLATE_FIELDS)}")
    return path


def _option(text: str) -> str:
    name = text.removeprefix("--")
    if not text.startswith("--") or name not in SLURM_OPTIONS:
        why = ENFORCED_SLURM_OPTIONS.get(name)
        kept = (f"Isthmus sets it ({why})" if why
                else "not an option Isthmus passes (write the long form, --qos)")
        raise ValueError(f"'{text}': {kept}; choose among "
                         f"{', '.join('--' + o for o in sorted(SLURM_OPTIONS))}")
    return text


class K8sNativePolicy(Strict):
    pod_template: list[Annotated[str, AfterValidator(_pod_field)]] = Field(
        default_factory=list, max_length=len(POD_TEMPLATE_FIELDS),
        description=f"pod template fields the team's overlays may add to: of "
        f"{', '.join(POD_TEMPLATE_FIELDS)}")


class SlurmNativePolicy(Strict):
    options: list[Annotated[str, AfterValidator(_option)]] = Field(
        default_factory=list, max_length=len(SLURM_OPTIONS),
        description=f"sbatch options the team may pass, as --name: of "
        f"{', '.join('--' + o for o in sorted(SLURM_OPTIONS))}")


class NativePolicy(Strict):
    """What a team may pass beyond the job spec (nothing when unset)."""

    k8s: K8sNativePolicy = Field(default_factory=K8sNativePolicy)
    slurm: SlurmNativePolicy = Field(default_factory=SlurmNativePolicy)


def native_problems(policy: NativePolicy | None, team: str, native: NativeOptions | None,
                    env: Sequence[str] = (),
                    reserved_prefixes: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(field, message) for each part of a job's `native` block its team's policy does not
    allow: a pod template field or an sbatch option outside the team's lists, a label or
    annotation under a reserved prefix, an overlay variable the job's `env` already sets."""
    if native is None:
        return []
    policy = policy or NativePolicy()
    out: list[tuple[str, str]] = []
    where = "isthmus.yaml teams[].native"
    if native.k8s is not None:
        allowed = policy.k8s.pod_template
        try:
            fields = list(overlay_fields(native.k8s.pod_template))
        except NativeProblem as exc:  # the spec model checked it; kept for a direct caller
            return [(f"native.k8s.pod_template.{exc.field}", exc.message)]
        for field, value in fields:
            name = f"native.k8s.pod_template.{field}"
            if field not in allowed:
                out.append((name, f"team {team} may not set {field} in a pod template "
                            f"overlay (its policy {where}.k8s.pod_template allows: "
                            f"{', '.join(allowed) or 'nothing'}); remove it or ask an admin"))
            elif field.startswith("metadata."):
                out += [(f"{name}.{key}", f"key {key!r} is under the reserved prefix {hit!r} "
                         "(tenancy.reserved_key_prefixes); use your own, like example.com/")
                        for key in value
                        if (hit := metadata_keys.reserved_by(key, reserved_prefixes))]
            elif field == "spec.containers[*].env":
                out += [(f"{name}[{i}].name", f"{item['name']} is set by the job's env; set it "
                         "in one place") for i, item in enumerate(value) if item["name"] in env]
    if native.slurm is not None:
        allowed = policy.slurm.options
        for i, text in enumerate(native.slurm.options):
            name, _ = slurm_option(text)
            if f"--{name}" not in allowed:
                out.append((f"native.slurm.options[{i}]",
                            f"team {team} may not pass --{name} (its policy "
                            f"{where}.slurm.options allows: {', '.join(allowed) or 'nothing'}); "
                            "remove it or ask an admin"))
    return out
