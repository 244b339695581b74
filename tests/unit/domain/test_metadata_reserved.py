"""Reserved label and annotation key prefixes (tenancy)."""

from __future__ import annotations

import pytest

from broker.domain.metadata_keys import DEFAULT_RESERVED_PREFIXES, reserved_by


@pytest.mark.parametrize(("key", "hit"), [
    ("sidecar.istio.io/inject", "sidecar.istio.io/"),
    ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/"),
    ("x.isthmus.io/anything", "isthmus.io/"),  # subdomains of a reserved domain
    ("container.apparmor.security.beta.kubernetes.io/trainer",
     "container.apparmor.security.beta.kubernetes.io/"),
    ("example.com/isthmus.io", None),
    ("notisthmus.io/x", None),  # a longer domain is not a subdomain
    ("note", None),
])
def test_reserved_by(key: str, hit: str | None) -> None:
    assert reserved_by(key, DEFAULT_RESERVED_PREFIXES) == hit


def test_exempt_prefix_wins() -> None:
    assert reserved_by("isthmus.io/fake-duration", DEFAULT_RESERVED_PREFIXES,
                       ["isthmus.io/fake-"]) is None
    assert reserved_by("isthmus.io/teardown", DEFAULT_RESERVED_PREFIXES,
                       ["isthmus.io/fake-"]) == "isthmus.io/"
