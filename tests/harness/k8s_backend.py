"""The Kubernetes backend on the local control plane, as its tests watch it."""

from __future__ import annotations

from collections.abc import Callable

from backends.k8s import K8sBackend
from broker.domain.facts import Fact
from tests.harness.wait import wait_until

MakeBackend = Callable[..., K8sBackend]


def wait_fact(backend: K8sBackend, name: str, ok: Callable[[Fact], bool],
              timeout: float = 60) -> Fact:
    def probe() -> Fact | None:
        fact = next((f for f in backend.observe([name]) if f.backend_name == name), None)
        return fact if fact is not None and ok(fact) else None

    return wait_until(probe, timeout=timeout, interval=0.3, what=f"a fact on {name}")
