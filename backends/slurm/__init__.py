"""Slurm backend: CLI or slurmrestd transport, script rendering, fact classification.

broker/wiring builds a SlurmBackend from an isthmus.yaml ``backends[]`` entry of kind ``slurm``
(its settings: the fields of ``SlurmSettings``) and the pools that name it (``SlurmPoolBinding``s).
Transports are created lazily; httpx is imported only for REST.
"""

from __future__ import annotations

from pathlib import Path

from backends.slurm.adapter import SlurmBackend
from backends.slurm.inventory import SlurmPoolBinding
from backends.slurm.owner_policy import OwnerPolicy, cluster_accounts
from backends.slurm.script import render
from backends.slurm.settings import SlurmSettings
from backends.slurm.transport import SubmitRefused, Transport
from backends.slurm.versions import UnsupportedSlurmVersion
from broker.logs import get_logger

log = get_logger(__name__)


def _rest_owner_policy(settings: SlurmSettings) -> OwnerPolicy:
    """The owner policy over REST: SlurmUser from `slurm_conf` when it is set and readable
    (slurmrestd has no endpoint for it); 'slurm' and root are denied regardless."""
    policy = settings.owner_policy()
    if settings.slurm_conf:
        try:
            text = Path(settings.slurm_conf).read_text(errors="replace")
        except OSError as exc:
            log.warning("SlurmUser unknown (%s: %s); denying 'slurm'", settings.slurm_conf,
                        exc.strerror)
            return policy
        policy = policy.with_cluster_accounts(*cluster_accounts(text))
    return policy


def make_transport(settings: SlurmSettings) -> Transport:
    if settings.transport == "rest":
        from backends.slurm.owner_tokens import OwnerTokens
        from backends.slurm.transport_rest import RestTransport

        owners = None
        if settings.submit_as_owner and settings.rest_jwt_key_file:
            owners = OwnerTokens.from_file(settings.rest_jwt_key_file,
                                           settings.owner_token_lifespan_s,
                                           policy=_rest_owner_policy(settings))
        return RestTransport(
            url=settings.rest_url or "", user=settings.rest_user or "",
            token=settings.token() or "", timeout=settings.timeout,
            version=settings.rest_version,
            allow_untested_version=settings.allow_untested_version, owner_tokens=owners,
        )
    from backends.slurm.transport_cli import CliTransport

    return CliTransport(slurm_conf=settings.slurm_conf, bin_dir=settings.bin_dir,
                        timeout=settings.timeout,
                        allow_untested_version=settings.allow_untested_version,
                        owner_policy=settings.owner_policy())


__all__ = [
    "SlurmBackend",
    "SlurmPoolBinding",
    "SlurmSettings",
    "SubmitRefused",
    "Transport",
    "UnsupportedSlurmVersion",
    "make_transport",
    "render",
]
