"""Slurm backend: CLI or slurmrestd transport, script rendering, fact classification.

``create(backend, pools)`` builds a SlurmBackend from an isthmus.yaml ``backends[]`` entry of
kind ``slurm`` and the pools that name it (each with a ``partition``). Settings keys are the
fields of ``SlurmSettings``. Transports are created lazily; httpx is imported only for REST.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from backends.base import SettingsError, Unsupported, register
from backends.slurm.adapter import SlurmBackend
from backends.slurm.inventory import PoolBinding
from backends.slurm.script import render
from backends.slurm.settings import SlurmSettings
from backends.slurm.transport import SubmitRefused, Transport
from backends.slurm.versions import UnsupportedSlurmVersion

if TYPE_CHECKING:
    from broker.config import Backend as BackendConfig
    from broker.config import IsthmusConfig, Pool


def make_transport(settings: SlurmSettings) -> Transport:
    if settings.transport == "rest":
        from backends.slurm.transport_rest import RestTransport

        return RestTransport(
            url=settings.rest_url or "", user=settings.rest_user or "",
            token=settings.token() or "", timeout=settings.timeout,
            version=settings.rest_version,
            allow_untested_version=settings.allow_untested_version,
        )
    from backends.slurm.transport_cli import CliTransport

    return CliTransport(slurm_conf=settings.slurm_conf, bin_dir=settings.bin_dir,
                        timeout=settings.timeout,
                        allow_untested_version=settings.allow_untested_version)


def create(backend: BackendConfig, pools: Sequence[Pool] = (),
           transport: Transport | None = None) -> SlurmBackend:
    """Factory registered as kind 'slurm': (config.Backend, its config.Pools) -> SlurmBackend."""
    try:
        settings = SlurmSettings.from_dict(dict(backend.settings))
    except (TypeError, ValueError) as exc:
        raise Unsupported(f"backends[{backend.name}].settings: {exc}") from None
    bindings = []
    for pool in pools:
        if pool.backend != backend.name:
            continue
        if not pool.partition:
            raise Unsupported(f"pools[{pool.name}].partition: a Slurm pool needs a partition")
        bindings.append(PoolBinding(name=pool.name, partition=pool.partition, flavor=pool.flavor,
                                    cost_weight=pool.cost_weight, shared=pool.shared,
                                    drained=pool.drained))
    return SlurmBackend(backend.name, bindings, settings, transport or make_transport(settings))


def check(config: IsthmusConfig, index: int) -> list[tuple[str, str]]:
    """What `create` would refuse for `config.backends[index]`, each problem with its path."""
    b = config.backends[index]
    where = f"backends[{index}].settings"
    problems: list[tuple[str, str]] = []
    try:
        SlurmSettings.from_dict(dict(b.settings))
    except SettingsError as exc:
        problems += [(f"{where}.{key}" if key else where, msg) for key, msg in exc.problems]
    for j, pool in enumerate(config.pools):
        if pool.backend == b.name and not pool.partition:
            problems.append((f"pools[{j}].partition", "a Slurm pool needs a partition"))
    return problems


register("slurm", create, check)

__all__ = [
    "PoolBinding",
    "SlurmBackend",
    "SlurmSettings",
    "SubmitRefused",
    "Transport",
    "UnsupportedSlurmVersion",
    "check",
    "create",
    "make_transport",
    "render",
]
