"""A job's pod template overlay (`native.k8s.pod_template`) merged into the pod template
manifests.py renders. Pure.

The overlay adds and never replaces: each field merges as `broker.domain.native` declares it
(new keys of labels and annotations, entries appended to tolerations and to every container's
env, a class name where Isthmus sets none). A key, variable or value Isthmus already rendered
is refused (Unsupported naming it) rather than overwritten, so the pool's nodes, the GPUs, the
security settings and the `isthmus.io/` keys stay the platform's whatever the overlay holds;
the team's policy was checked at submit, this is the backend's own guard.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from backends.base import Unsupported
from broker.domain.native import EVERY, POD_TEMPLATE_FIELDS, NativeProblem, overlay_fields


def apply(template: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`template` with `overlay` merged in (a new dict; `template` is left as it was)."""
    out = copy.deepcopy(template)
    try:
        fields = list(overlay_fields(overlay))
    except NativeProblem as exc:
        raise Unsupported(f"native.k8s.pod_template.{exc.field}: {exc.message}") from None
    for field, value in fields:
        parent_path, _, key = field.rpartition(".")
        for parent in _parents(out, parent_path):
            _merge(parent, key, copy.deepcopy(value), field)
    return out


def _parents(template: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The mappings a dotted path names in the rendered template (every container for
    `spec.containers[*]`), created where missing."""
    nodes = [template]
    for part in path.split("."):
        each = part.endswith(EVERY)
        name = part.removesuffix(EVERY)
        if each:
            nodes = [item for n in nodes for item in n.get(name, [])]
        else:
            nodes = [n.setdefault(name, {}) for n in nodes]
    return nodes


def _merge(parent: dict[str, Any], key: str, value: Any, field: str) -> None:
    how = POD_TEMPLATE_FIELDS[field]
    where = f"native.k8s.pod_template.{field}"
    if how == "keys":
        have = parent.setdefault(key, {})
        taken = sorted(set(have) & set(value))
        if taken:
            raise Unsupported(f"{where}: {taken} are set by Isthmus or the job; an overlay adds "
                              "keys, it does not replace them")
        have.update(value)
    elif how == "append":
        have_list = parent.setdefault(key, [])
        if key == "env":
            names = {e.get("name") for e in have_list}
            taken = sorted(str(e.get("name")) for e in value if e.get("name") in names)
            if taken:
                raise Unsupported(f"{where}: {taken} are set by Isthmus or the job's env; an "
                                  "overlay adds variables, it does not replace them")
        have_list.extend(value)
    else:
        if key in parent and parent[key] != value:
            raise Unsupported(f"{where}: Isthmus sets {key} to {parent[key]!r} for this pool; "
                              "an overlay does not replace it")
        parent[key] = value
