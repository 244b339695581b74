"""Kubernetes backend: Indexed Job + headless Service per gang, watch cache, classification.

``create(backend, pools)`` builds a K8sBackend from an isthmus.yaml ``backends[]`` entry of kind
``k8s`` and the pools that name it (each with a ``node_selector``). Settings keys are the
fields of ``K8sSettings``. The ``kubernetes`` client is imported only when the backend first
talks to the API server, so importing this package needs neither the client nor a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backends.base import SettingsError, Unsupported, register
from backends.k8s.adapter import K8sBackend
from backends.k8s.classify import ClassifyPolicy, judge
from backends.k8s.manifests import render
from backends.k8s.settings import K8sSettings, PoolBinding

if TYPE_CHECKING:
    from broker.config import Backend as BackendConfig
    from broker.config import IsthmusConfig, Pool


def create(backend: BackendConfig, pools: Sequence[Pool] = (),
           api_client: Any | None = None) -> K8sBackend:
    """Factory registered as kind 'k8s': (config.Backend, its config.Pools) -> K8sBackend."""
    try:
        settings = K8sSettings.from_dict(dict(backend.settings))
    except (TypeError, ValueError) as exc:
        raise Unsupported(f"backends[{backend.name}].settings: {exc}") from None
    bindings = []
    for pool in pools:
        if pool.backend != backend.name:
            continue
        if not pool.node_selector:
            raise Unsupported(f"pools[{pool.name}].node_selector: a Kubernetes pool needs a "
                              "node selector (e.g. {isthmus.io/pool: h100})")
        bindings.append(PoolBinding(name=pool.name, flavor=pool.flavor,
                                    node_selector=dict(pool.node_selector),
                                    cost_weight=pool.cost_weight, shared=pool.shared,
                                    drained=pool.drained))
    unknown = sorted(set(settings.modes) - {b.name for b in bindings})
    if unknown:
        raise Unsupported(f"backends[{backend.name}].settings.modes: no pool(s) {unknown} "
                          "on this backend")
    return K8sBackend(backend.name, bindings, settings, api_client=api_client)


def check(config: IsthmusConfig, index: int) -> list[tuple[str, str]]:
    """What `create` would refuse for `config.backends[index]`, each problem with its path."""
    b = config.backends[index]
    where = f"backends[{index}].settings"
    problems: list[tuple[str, str]] = []
    try:
        settings = K8sSettings.from_dict(dict(b.settings))
    except SettingsError as exc:
        problems += [(f"{where}.{key}" if key else where, msg) for key, msg in exc.problems]
        settings = None
    mine = set()
    for j, pool in enumerate(config.pools):
        if pool.backend != b.name:
            continue
        mine.add(pool.name)
        if not pool.node_selector:
            problems.append((f"pools[{j}].node_selector", "a Kubernetes pool needs a node "
                             "selector (e.g. {isthmus.io/pool: h100})"))
    if settings is not None:
        for name in sorted(set(settings.modes) - mine):
            problems.append((f"{where}.modes.{name}", f"no pool {name} on this backend"))
    return problems


register("k8s", create, check)

__all__ = [
    "ClassifyPolicy",
    "K8sBackend",
    "K8sSettings",
    "PoolBinding",
    "check",
    "create",
    "judge",
    "render",
]
