"""Job labels and annotations become Kubernetes object metadata, so they follow Kubernetes'
syntax (checked at submit, where the user can fix them, not at dispatch):

- a key is `[prefix/]name`: the name is 1-63 characters of letters, digits, '-', '_' and '.',
  starting and ending with a letter or digit; the optional prefix is a DNS subdomain;
- a label value is empty or like a name (at most 63 characters); an annotation value is free;
- label keys under `isthmus.io/` (and its subdomains) are reserved: Isthmus finds and adopts
  its objects by them. Annotations may use it (the local test cluster scripts pods that way).

Tenancy (`tenancy:` in isthmus.yaml, checked at submit by `reserved_problem`): keys that other
controllers or the node act on (queue names, gang groups, apparmor and seccomp profiles, mesh
sidecars) are refused on labels and annotations alike, so one team cannot opt its pods out of
the platform's rules or into another team's queue.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RESERVED = "isthmus.io"
DEFAULT_RESERVED_PREFIXES = (
    "isthmus.io/",
    "kueue.x-k8s.io/",
    "scheduling.k8s.io/",
    "volcano.sh/",
    "scheduling.volcano.sh/",
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "sidecar.istio.io/",
)

# Keys Isthmus's own clients write into a job (isbatch keeps the sbatch request it could not
# map as this annotation, without effect; a job from a template names its template); always
# allowed, whatever the site's exemptions: they inform, they grant nothing.
PLATFORM_KEY_PREFIXES = ("sbatch.isthmus.io/", "template.isthmus.io/")


def key_problem(key: str, *, reserved: bool = False) -> str | None:
    """What is wrong with a label or annotation key, or None."""
    prefix, _, name = key.rpartition("/")
    if not _NAME.match(name):
        return ("the name part must be 1-63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit")
    if prefix:
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
            return "the prefix before '/' must be a lower-case DNS subdomain like example.com"
        if reserved and (prefix == RESERVED or prefix.endswith("." + RESERVED)):
            return f"the prefix {prefix}/ is reserved; use your own, like example.com/"
    return None


def label_value_problem(value: str) -> str | None:
    if value == "" or _NAME.match(value):
        return None
    return ("a label value must be empty or 1-63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit")


def check(kind: str, items: dict[str, str], *, labels: bool) -> dict[str, str]:
    """Raise ValueError naming every bad entry of `items`: keys always; for labels
    (`labels=True`) also values and the reserved prefix."""
    bad: list[str] = []
    for k, v in items.items():
        why = key_problem(k, reserved=labels)
        if why is not None:
            bad.append(f"{kind} key {k!r}: {why}")
        elif labels and (why := label_value_problem(v)) is not None:
            bad.append(f"{kind} {k!r} value {v!r}: {why}")
    if bad:
        raise ValueError("; ".join(bad))
    return items


def reserved_by(key: str, prefixes: Sequence[str], exempt: Sequence[str] = ()) -> str | None:
    """The reserved prefix `key` falls under, or None. A key is under a prefix when it starts
    with it; a prefix that ends in '/' also covers its subdomains (`x.isthmus.io/k` under
    `isthmus.io/`). An exempt prefix wins."""
    if any(key.startswith(e) for e in exempt):
        return None
    domain = key.rpartition("/")[0]
    for p in prefixes:
        if key.startswith(p) or (p.endswith("/") and domain.endswith("." + p[:-1])):
            return p
    return None


def reserved_problems(
    kind: str, items: Mapping[str, str], prefixes: Sequence[str], exempt: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """(key, message) for every key of `items` under a reserved prefix."""
    out = []
    for k in items:
        hit = reserved_by(k, prefixes, exempt)
        if hit is not None:
            out.append((k, f"{kind} key {k!r} is under the reserved prefix {hit!r} "
                           "(set by the platform, not by jobs); use your own prefix, like "
                           "example.com/"))
    return out
