"""Slurm backend: CLI or slurmrestd transport, script rendering, fact classification.

broker/wiring builds a SlurmBackend from an isthmus.yaml ``backends[]`` entry of kind ``slurm``
(its settings: the fields of ``SlurmSettings``) and the pools that name it (``PoolBinding``s).
Transports are created lazily; httpx is imported only for REST.
"""

from __future__ import annotations

from backends.slurm.adapter import SlurmBackend
from backends.slurm.inventory import PoolBinding
from backends.slurm.script import render
from backends.slurm.settings import SlurmSettings
from backends.slurm.transport import SubmitRefused, Transport
from backends.slurm.versions import UnsupportedSlurmVersion


def make_transport(settings: SlurmSettings) -> Transport:
    if settings.transport == "rest":
        from backends.slurm.owner_tokens import OwnerTokens
        from backends.slurm.transport_rest import RestTransport

        owners = None
        if settings.submit_as_owner and settings.rest_jwt_key_file:
            owners = OwnerTokens.from_file(settings.rest_jwt_key_file,
                                           settings.owner_token_lifespan_s)
        return RestTransport(
            url=settings.rest_url or "", user=settings.rest_user or "",
            token=settings.token() or "", timeout=settings.timeout,
            version=settings.rest_version,
            allow_untested_version=settings.allow_untested_version, owner_tokens=owners,
        )
    from backends.slurm.transport_cli import CliTransport

    return CliTransport(slurm_conf=settings.slurm_conf, bin_dir=settings.bin_dir,
                        timeout=settings.timeout,
                        allow_untested_version=settings.allow_untested_version)


__all__ = [
    "PoolBinding",
    "SlurmBackend",
    "SlurmSettings",
    "SubmitRefused",
    "Transport",
    "UnsupportedSlurmVersion",
    "make_transport",
    "render",
]
