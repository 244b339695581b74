"""Simulated backend (same protocol as Slurm and Kubernetes) for demos, simulation and
benchmarks.

``create(backend, pools)`` builds a LiveSimBackend (wall time, `speed` x faster) from an
isthmus.yaml ``backends[]`` entry of kind ``sim`` and the pools that name it (each with a
``capacity``). Settings keys are the fields of ``SimSettings``. Tests and benchmarks drive a
``SimBackend`` on a virtual ``SimClock`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from backends.base import SettingsError, Unsupported, register
from backends.sim.backend import DURATION_ANNOTATION, DURATION_ENV, SimBackend
from backends.sim.clock import SimClock, WallClock
from backends.sim.faults import FAIL_ANNOTATION, Fault
from backends.sim.live import LiveSimBackend, build
from backends.sim.model import ExternalLoad, SimFailures, SimPoolSpec
from backends.sim.settings import SimSettings

if TYPE_CHECKING:
    from broker.config import Backend as BackendConfig
    from broker.config import IsthmusConfig, Pool


def create(backend: BackendConfig, pools: Sequence[Pool] = ()) -> LiveSimBackend:
    """Factory registered as kind 'sim': (config.Backend, its config.Pools) -> LiveSimBackend.
    The wiring sets `progress_url` to the broker's own listener when the file leaves it out."""
    try:
        settings = SimSettings.from_dict(dict(backend.settings))
    except (TypeError, ValueError) as exc:
        raise Unsupported(f"backends[{backend.name}].settings: {exc}") from None
    mine = [p for p in pools if p.backend == backend.name]
    return build(backend, mine, settings, settings.progress_url)


def check(config: IsthmusConfig, index: int) -> list[tuple[str, str]]:
    """What `create` would refuse for `config.backends[index]`, each problem with its path."""
    b = config.backends[index]
    where = f"backends[{index}].settings"
    problems: list[tuple[str, str]] = []
    try:
        settings: SimSettings | None = SimSettings.from_dict(dict(b.settings))
    except SettingsError as exc:
        problems += [(f"{where}.{key}" if key else where, msg) for key, msg in exc.problems]
        settings = None
    mine = set()
    for j, pool in enumerate(config.pools):
        if pool.backend != b.name:
            continue
        mine.add(pool.name)
        if pool.capacity is None:
            problems.append((f"pools[{j}].capacity", "a simulated pool needs its shape "
                             "(e.g. {nodes: 4, gpus_per_node: 8, nodes_per_rack: 2})"))
    if settings is not None:
        for name in sorted(set(settings.pools) - mine):
            problems.append((f"{where}.pools.{name}", f"no pool {name} on this backend"))
    return problems


register("sim", create, check)

__all__ = [
    "DURATION_ANNOTATION",
    "DURATION_ENV",
    "FAIL_ANNOTATION",
    "ExternalLoad",
    "Fault",
    "LiveSimBackend",
    "SimBackend",
    "SimClock",
    "SimFailures",
    "SimPoolSpec",
    "SimSettings",
    "WallClock",
    "check",
    "create",
]
