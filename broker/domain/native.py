"""Native options: what a trusted team may hand a backend beyond the JobSpec (the guarded escape
hatch of issue 33). A job's `native:` block carries a Kubernetes pod template overlay
(`native.k8s.pod_template`) and extra sbatch options (`native.slurm.options`); each applies
only on its kind of backend.

Two lists fix what can ever pass, whatever a site allows: `POD_TEMPLATE_FIELDS` (the pod
template fields an overlay may add to, each with how it merges) and `SLURM_OPTIONS` (the sbatch
options that may be passed). Everything else is the platform's: the pool's nodes, the GPUs,
CPUs and memory admission reserved, the security settings, the gang's names, `isthmus.io/`
keys and the rank variables (`ENFORCED_POD_FIELDS`, `ENFORCED_SLURM_OPTIONS` say why). Which of
the passable ones a team may use is its policy in isthmus.yaml (`teams[].native`, checked at
submit by broker/config_native.py); the backends merge the overlay so that it adds and never
replaces (backends/k8s/overlay.py, backends/slurm/script.py).

The spec model checks the shape here (structure, names, sizes), so a bad overlay is a 422
naming its path whichever team sends it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.domain import metadata_keys

POD_TEMPLATE_FIELDS: dict[str, str] = {
    "metadata.labels": "keys",  # new keys only: a key the pod already has is refused
    "metadata.annotations": "keys",
    "spec.tolerations": "append",  # after the pool's own
    "spec.topologySpreadConstraints": "append",
    "spec.priorityClassName": "set",  # only where Isthmus sets none
    "spec.runtimeClassName": "set",
    "spec.containers[*].env": "append",  # new names only, on every container
    "spec.containers[*].envFrom": "append",  # Kubernetes lets `env` (Isthmus's) win over it
}
"""The pod template fields an overlay may add to, and how: `keys` (new keys of a mapping),
`append` (after the rendered list) or `set` (a value Isthmus leaves unset)."""

ENFORCED_POD_FIELDS: dict[str, str] = {
    "spec.nodeSelector": "the pool's nodes",
    "spec.affinity": "the pool's nodes and the gang's topology domain",
    "spec.nodeName": "the pool's nodes",
    "spec.schedulerName": "the pool's scheduler",
    "spec.containers[*].resources": "the GPUs, CPUs and memory admission reserved",
    "spec.securityContext": "security settings",
    "spec.containers[*].securityContext": "security settings",
    "spec.hostNetwork": "security settings",
    "spec.hostPID": "security settings",
    "spec.hostIPC": "security settings",
    "spec.serviceAccountName": "security settings",
    "spec.volumes": "the mounts tenancy.mounts allows",
    "spec.containers[*].volumeMounts": "the mounts tenancy.mounts allows",
    "spec.containers[*].image": "the job's entrypoint",
    "spec.containers[*].command": "the job's entrypoint",
}
"""Fields an admin might think of allowing that Isthmus keeps (for the messages)."""

SLURM_OPTIONS = frozenset({
    "qos", "constraint", "prefer", "reservation", "licenses", "wckey", "nice", "tmp",
    "network", "profile", "acctg-freq", "gres-flags", "mcs-label", "deadline", "delay-boot",
})
"""sbatch long options a site may let a team pass (`--constraint` is ANDed with a rack
constraint Isthmus sets; every other one is left to Isthmus)."""

ENFORCED_SLURM_OPTIONS: dict[str, str] = {
    **dict.fromkeys(("job-name", "comment"), "Isthmus finds and adopts its jobs by them"),
    **dict.fromkeys(("partition", "nodelist", "exclude", "switches", "nodes", "ntasks",
                     "ntasks-per-node", "gres", "gpus", "gpus-per-node", "gpus-per-task",
                     "cpus-per-task", "mem", "mem-per-gpu", "mem-per-cpu", "exclusive"),
                    "the placement and the resources admission reserved"),
    **dict.fromkeys(("time", "signal", "requeue", "no-requeue", "hold", "begin",
                     "dependency", "array"), "the job's lifecycle, which Isthmus runs"),
    **dict.fromkeys(("output", "error", "chdir", "export", "uid", "gid", "account",
                     "container", "wrap"), "the job's files, identity and account"),
}
"""Options an admin might think of allowing that Isthmus sets itself (for the messages)."""

RANK_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                      "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "GPUS_PER_NODE"})
"""Variables Isthmus gives every rank; an overlay may not name them (MASTER_PORT goes in the
job's env)."""

MAX_OVERLAY_BYTES = 64 * 1024
MAX_LIST_ITEMS = 64
MAX_SLURM_OPTIONS = 32
_SLURM_OPTION = re.compile(r"--([a-z][a-z0-9-]{0,39})(=([A-Za-z0-9._:+,=@%&|()\[\]*/-]{1,256}))?")
BARE_SLURM_OPTIONS = frozenset({"nice"})
"""Passable options sbatch takes without a value; every other one needs `=value`."""
_SECRET_SOURCES = ("secretKeyRef", "secretRef")
"""Where an overlay's variables may not come from: the pods of every team may share a
namespace, where Isthmus keeps each attempt's progress token in a Secret."""
_PLATFORM_ENV = ("SLURM_", "NVIDIA_", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "ISTHMUS_")
"""Prefixes of variables the platform, the GPU runtime or Slurm set for a rank."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,252}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
EVERY = "[*]"


class NativeProblem(ValueError):
    """An overlay or option that cannot pass: `field` names it (`spec.nodeSelector`,
    `--partition`), `message` says why and what to do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def overlay_fields(overlay: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field, value) for each of `POD_TEMPLATE_FIELDS` the overlay sets; NativeProblem naming
    the first path that is none of them (or not shaped as the pod template has it)."""
    yield from _walk(overlay, "")


def _walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if prefix in POD_TEMPLATE_FIELDS:
        yield prefix, node
        return
    if any(f.startswith(prefix + EVERY) for f in POD_TEMPLATE_FIELDS):
        if not (isinstance(node, list) and len(node) == 1 and isinstance(node[0], dict)):
            raise NativeProblem(prefix, "give a list of one mapping: what it holds is added "
                                f"to every one of them ({prefix}{EVERY})")
        yield from _walk(node[0], prefix + EVERY)
        return
    if not isinstance(node, dict):
        raise NativeProblem(prefix or "pod_template", "a mapping is expected here")
    for key in node:
        path = f"{prefix}.{key}" if prefix else str(key)
        if not any(f == path or f.startswith((path + ".", path + "[")) for f in
                   POD_TEMPLATE_FIELDS):
            raise NativeProblem(path, _not_overlayable(path))
        yield from _walk(node[key], path)


def _not_overlayable(path: str) -> str:
    why = ENFORCED_POD_FIELDS.get(path)
    kept = f"Isthmus sets it ({why})" if why else "not a field an overlay may set"
    return f"{kept}; an overlay may add only to {', '.join(POD_TEMPLATE_FIELDS)}"


def field_shape_problem(field: str, value: Any) -> str | None:
    """What is wrong with the value an overlay gives `field`, or None."""
    how = POD_TEMPLATE_FIELDS[field]
    if how == "keys":
        return _metadata_problem(field, value)
    if how == "set":
        if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
            return "a lower-case DNS name is expected (the name of a class of the cluster)"
        if value.startswith("system-"):
            return ("the cluster's system- classes are for its own components (they preempt "
                    "any pod); name a class made for jobs")
        return None
    if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
        return "a list of mappings is expected"
    if len(value) > MAX_LIST_ITEMS:
        return f"at most {MAX_LIST_ITEMS} entries"
    if field == "spec.containers[*].env":
        return _env_problem(value)
    return _env_from_problem(value) if field == "spec.containers[*].envFrom" else None


def _metadata_problem(field: str, value: Any) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return "a mapping of text values is expected"
    labels = field == "metadata.labels"
    try:
        metadata_keys.check("label" if labels else "annotation", value, labels=labels)
    except ValueError as exc:
        return str(exc)
    for key in value:  # annotations too: Isthmus reads its own off the pods
        if metadata_keys.reserved_by(key, (metadata_keys.RESERVED + "/",)) is not None:
            return (f"key {key!r}: the prefix {metadata_keys.RESERVED}/ is Isthmus's; use "
                    "your own, like example.com/")
    return None


def _env_problem(entries: list[dict[str, Any]]) -> str | None:
    for i, item in enumerate(entries):
        name = item.get("name")
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            return f"[{i}].name: a variable name (letters, digits, '_') is expected"
        if name in RANK_ENV or name.startswith(_PLATFORM_ENV) or name in ("LD_PRELOAD",
                                                                          "LD_AUDIT"):
            return (f"[{i}].name: {name} is set by Isthmus, Slurm or the GPU runtime for every "
                    "rank (MASTER_PORT goes in the job's env); choose another name")
        source = item.get("valueFrom")
        if isinstance(source, dict) and any(k in source for k in _SECRET_SOURCES):
            return (f"[{i}].valueFrom: a Secret is not a source an overlay may read (the "
                    "namespace may be shared by teams); mount it through tenancy.mounts")
    return None


def _env_from_problem(entries: list[dict[str, Any]]) -> str | None:
    for i, item in enumerate(entries):
        if any(k in item for k in _SECRET_SOURCES):
            return (f"[{i}].secretRef: a Secret is not a source an overlay may read (the "
                    "namespace may be shared by teams); mount it through tenancy.mounts")
    return None


def _balanced(value: str) -> bool:
    """Parentheses and brackets nest and close (a constraint ANDed with the rack's stays one
    term)."""
    depth: list[str] = []
    for c in value:
        if c in "([":
            depth.append(c)
        elif c in ")]" and (not depth or depth.pop() != ("(" if c == ")" else "[")):
            return False
    return not depth


def check_pod_template(overlay: Mapping[str, Any]) -> dict[str, Any]:
    """The overlay's shape (every path one of `POD_TEMPLATE_FIELDS`, each value as the pod has
    it, the whole at most MAX_OVERLAY_BYTES); ValueError naming the path."""
    if len(json.dumps(overlay, separators=(",", ":"))) > MAX_OVERLAY_BYTES:
        raise ValueError(f"at most {MAX_OVERLAY_BYTES // 1024} KiB of JSON")
    try:
        for field, value in overlay_fields(overlay):
            why = field_shape_problem(field, value)
            if why is not None:
                raise NativeProblem(field, why)
    except NativeProblem as exc:
        raise ValueError(str(exc)) from None
    return dict(overlay)


def slurm_option(text: str) -> tuple[str, str | None]:
    """('qos', 'high') of '--qos=high'; NativeProblem naming the option when it is not one
    `--name[=value]` of safe characters, or not one Isthmus lets pass."""
    m = _SLURM_OPTION.fullmatch(text)
    if m is None:
        raise NativeProblem(text[:60], "write one long option as --name=value (the value of "
                            "letters, digits and ._:+,=@%&|()[]*/- only, no spaces)")
    name, value = m.group(1), m.group(3)
    if name not in SLURM_OPTIONS:
        why = ENFORCED_SLURM_OPTIONS.get(name)
        kept = f"Isthmus sets it ({why})" if why else "not an option Isthmus passes"
        raise NativeProblem(f"--{name}", f"{kept}; passable options: "
                            f"{', '.join('--' + o for o in sorted(SLURM_OPTIONS))}")
    if value is None and name not in BARE_SLURM_OPTIONS:
        raise NativeProblem(f"--{name}", f"give its value: --{name}=VALUE")
    if value is not None and not _balanced(value):
        raise NativeProblem(f"--{name}", "its parentheses and brackets must nest and close")
    return name, value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class K8sNative(_Strict):
    pod_template: dict[str, Any] = Field(
        description="merged into the pod template of every rank: it may add to "
        f"{', '.join(POD_TEMPLATE_FIELDS)} only, never replace what Isthmus sets")

    @field_validator("pod_template")
    @classmethod
    def _shape(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_pod_template(v)


class SlurmNative(_Strict):
    options: list[str] = Field(
        max_length=MAX_SLURM_OPTIONS,
        description="extra sbatch options as #SBATCH writes them (--qos=high), each at most "
        "once; passed as they are, never through a shell")

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for i, text in enumerate(v):
            try:
                name, _ = slurm_option(text)
            except NativeProblem as exc:
                raise ValueError(f"[{i}] {exc}") from None
            if name in seen:
                raise ValueError(f"[{i}] --{name} is given twice; give it once")
            seen.add(name)
        return v

    def parsed(self) -> list[tuple[str, str | None]]:
        return [slurm_option(o) for o in self.options]


class NativeOptions(_Strict):
    """Backend-native options a team's policy allows (isthmus.yaml `teams[].native`)."""

    k8s: K8sNative | None = None
    slurm: SlurmNative | None = None

