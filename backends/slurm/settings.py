"""Backend settings (isthmus.yaml ``backends[].settings`` for kind ``slurm``), checked up front."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict

from backends.base import SettingsError, parse_settings
from backends.slurm.containers import ContainerSettings
from backends.slurm.owner_policy import (
    ALWAYS_DENIED,
    MAX_MIN_UID,
    MIN_MIN_UID,
    UNIX_USER,
    OwnerPolicy,
)
from backends.slurm.owner_tokens import MAX_LIFESPAN_S, MIN_LIFESPAN_S
from backends.slurm.script import RenderSettings

_ACCOUNT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_DENIED_OWNERS = 256


def _owner_token_problems(settings: SlurmSettings) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    key = settings.rest_jwt_key_file
    if key is not None and not os.path.isabs(key):
        problems.append(("rest_jwt_key_file", "must be an absolute path"))
    if settings.submit_as_owner and settings.transport == "rest" and not key:
        problems.append(("submit_as_owner", "with transport 'rest' needs rest_jwt_key_file "
                         "(the cluster's JWT key, to sign a token per job owner)"))
    if not MIN_LIFESPAN_S <= settings.owner_token_lifespan_s <= MAX_LIFESPAN_S:
        problems.append(("owner_token_lifespan_s",
                         f"must be {MIN_LIFESPAN_S} to {MAX_LIFESPAN_S} seconds"))
    return problems + _owner_problems(settings)


def _owner_problems(settings: SlurmSettings) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not MIN_MIN_UID <= settings.min_owner_uid <= MAX_MIN_UID:
        problems.append(("min_owner_uid", f"must be {MIN_MIN_UID} to {MAX_MIN_UID} "
                         "(uid 0 never owns a job)"))
    if len(settings.denied_owners) > MAX_DENIED_OWNERS:
        problems.append(("denied_owners", f"at most {MAX_DENIED_OWNERS} names"))
    for i, name in enumerate(settings.denied_owners[:MAX_DENIED_OWNERS]):
        if not UNIX_USER.match(str(name)):
            problems.append((f"denied_owners[{i}]", f"{name!r} is not a Unix user name"))
    denied = ALWAYS_DENIED | set(settings.denied_owners)
    for who, unix in settings.unix_users.items():
        if not UNIX_USER.match(str(unix)):
            problems.append((f"unix_users.{who}", f"{unix!r} is not a Unix user name"))
        elif unix in denied:
            problems.append((f"unix_users.{who}", f"{unix!r} is a system account that may "
                             "not own jobs (root, slurm, nobody and denied_owners)"))
    return problems


@dataclass(frozen=True, slots=True)
class SlurmSettings:
    __pydantic_config__ = ConfigDict(extra="forbid")  # parse_settings: unknown keys refused

    transport: Literal["cli", "rest"] = "cli"  # "cli" (login node) or "rest" (slurmrestd)
    # CLI
    slurm_conf: str | None = None  # SLURM_CONF for the commands
    bin_dir: str | None = None  # where sbatch/squeue/... live, when not on PATH
    timeout: float = 30.0  # seconds, per command or HTTP request
    # REST
    rest_url: str | None = None  # e.g. http://slurmrestd:6820
    rest_user: str | None = None  # X-SLURM-USER-NAME
    rest_token: str | None = None  # X-SLURM-USER-TOKEN (prefer rest_token_env)
    rest_token_env: str | None = None  # name of an environment variable holding the token
    rest_version: str | None = None  # force an OpenAPI version, e.g. "v0.0.38"
    # submit_as_owner over REST: the cluster's JWT HS256 key (slurm.conf AuthAltParameters
    # jwt_key=), mode 600; the broker signs a token per job owner, valid this many seconds
    rest_jwt_key_file: str | None = None
    owner_token_lifespan_s: int = 60
    # scripts
    work_dir: str = "/var/tmp/isthmus-slurm-jobs"  # noqa: S108 - a default; set per site
    python: str = "python3"  # interpreter for the launcher on compute nodes
    master_port: int = 29500
    gpu_request: Literal["gres", "gpus-per-node"] = "gres"  # --gres=gpu:T:N or --gpus-per-node
    rack_features: bool = False  # nodes carry their rack's name as a feature
    extra_directives: tuple[str, ...] = ()
    # how ranks run a job's entrypoint.image (backends/slurm/containers.py); default 'none':
    # this backend's pools are never offered to a job that names an image
    container: ContainerSettings = field(default_factory=ContainerSettings)
    # classification and accounting
    oom_is_user_error: bool = True
    # drain-reason prefixes of the site's health checker: a job that failed on a node drained
    # with one is an infrastructure failure (Slurm's own reasons are known already)
    infra_drain_reasons: tuple[str, ...] = ()
    accounting_lookback_s: int = 7 * 86400
    allow_untested_version: bool = False
    user: str | None = None  # the user Isthmus submits as (default: this process / rest_user)
    # tenancy: each job is submitted as its owner (its API user, mapped through unix_users,
    # else the same name), so each job's files are its owner's. cli: the broker runs as root
    # and runs sbatch as the owner; rest: it signs a short-lived token for the owner with
    # rest_jwt_key_file
    submit_as_owner: bool = False
    unix_users: Mapping[str, str] = field(default_factory=dict)  # API user -> Unix user
    # never submit as: a uid below min_owner_uid (or a reserved system uid), root, slurm,
    # nobody, the cluster's SlurmUser / SlurmdUser, or a name in denied_owners
    min_owner_uid: int = 1000
    denied_owners: tuple[str, ...] = ()
    accounts: Mapping[str, str] = field(default_factory=dict)  # team -> --account

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SlurmSettings:
        """Raises SettingsError (a ValueError) naming every bad key."""
        settings = parse_settings(cls, data, "slurm")
        problems: list[tuple[str, str]] = []
        if settings.transport == "rest" and not settings.rest_url:
            problems.append(("rest_url", "required when transport is 'rest'"))
        if settings.timeout <= 0:
            problems.append(("timeout", "must be > 0 seconds"))
        if not 1 <= settings.master_port <= 65535:
            problems.append(("master_port", "must be a TCP port (1-65535)"))
        problems += _owner_token_problems(settings)
        problems += settings.container.problems()
        for team, account in settings.accounts.items():
            if not _ACCOUNT.match(str(account)):
                problems.append((f"accounts.{team}", f"{account!r} is not a Slurm account name"))
        try:
            settings.render_settings()  # validates work_dir, python, extra_directives
        except ValueError as exc:
            text = str(exc)
            key = text.split(" ", 1)[0].rstrip(":")
            problems.append((key, text) if key in cls.__dataclass_fields__ else ("", text))
        if problems:
            raise SettingsError(problems)
        return settings

    def render_settings(self) -> RenderSettings:
        return RenderSettings(work_dir=self.work_dir, python=self.python,
                              master_port=self.master_port, gpu_request=self.gpu_request,
                              rack_features=self.rack_features,
                              extra_directives=self.extra_directives,
                              container=self.container)

    def unix_user(self, owner: str | None) -> str | None:
        """The Unix user a job of `owner` is submitted as, or None (the broker's own)."""
        if not self.submit_as_owner:
            return None
        if not owner:
            raise ValueError("the job has no owner to submit as")
        return self.unix_users.get(owner, owner)

    def owner_policy(self) -> OwnerPolicy:
        """Who jobs may be submitted as; names mapped in unix_users are vouched for by the
        admin (allowed while unknown on the broker's host; the cluster's uid is checked)."""
        return OwnerPolicy.of(self.min_owner_uid, self.denied_owners,
                              vouched=self.unix_users.values())

    def token(self) -> str | None:
        if self.rest_token_env:
            return os.environ.get(self.rest_token_env)
        return self.rest_token
