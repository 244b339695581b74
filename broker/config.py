"""The isthmus.yaml model: backends, pools, flavors, teams with quotas and cohorts, API tokens.

Cross-references are checked when the file is loaded, so that a typo in a pool's flavor is an
error at start-up naming the pool and the field, not a job stuck later.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from broker.config_native import NativePolicy
from broker.config_slurm_compat import SlurmCompat
from broker.config_templates import JobTemplate, fill
from broker.config_tuning import (
    AdmissionTuning,
    FairShareTuning,
    OrderingTuning,
    PlacementTuning,
    Policies,
    PreemptionTuning,
    RetryTuning,
    ScoreTuning,
)
from broker.config_tuning import Strict as _Strict
from broker.domain.metadata_keys import DEFAULT_RESERVED_PREFIXES
from broker.domain.notices import EmailAddress, Subscription
from broker.domain.spec import (
    DAY,
    BackendKind,
    BackoffDuration,
    Ceiling,
    GraceDuration,
    MemorySize,
    RuntimeDuration,
)

__all__ = ["AdmissionTuning", "FairShareTuning", "OrderingTuning", "PlacementTuning",
           "Policies", "PreemptionTuning", "RetryTuning", "ScoreTuning"]  # and what follows

NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


class ConfigError(ValueError):
    """A configuration problem, with one line per issue naming the field."""




class Role(StrEnum):
    USER = "user"
    ADMIN = "admin"


class ApiToken(_Strict):
    """A bearer token. The secret itself is never in the file: give its SHA-256 or an env var."""

    name: str = Field(min_length=1)
    team: str | None = None
    role: Role = Role.USER
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    token_env: str | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> ApiToken:
        if (self.token_sha256 is None) == (self.token_env is None):
            raise ValueError("give exactly one of token_sha256 or token_env")
        if self.role is Role.USER and not self.team:
            raise ValueError("a user token needs a team")
        return self

    def digest(self) -> str | None:
        if self.token_sha256:
            return self.token_sha256
        secret = os.environ.get(self.token_env or "")
        return hashlib.sha256(secret.encode()).hexdigest() if secret else None


# Asymmetric only: an HMAC algorithm would let anyone holding the issuer's public key sign.
OIDC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                   "ES256", "ES384", "ES512", "EdDSA")


class OidcAuth(_Strict):
    """JWT bearer tokens from an OpenID Connect issuer, checked against its JWKS.

    Keys come from `jwks_file`, else `jwks_url`, else the issuer's discovery document
    (`<issuer>/.well-known/openid-configuration`), cached for `jwks_cache_s`. The claims
    named here give the caller's name, team and role; a group in `admin_values` is an admin.
    """

    issuer: str = Field(min_length=1, description="must equal the tokens' `iss`")
    audiences: list[str] = Field(min_length=1, description="one must be in the tokens' `aud`")
    algorithms: list[str] = Field(default_factory=lambda: ["RS256"], min_length=1)
    jwks_file: str | None = None
    jwks_url: str | None = None
    jwks_cache_s: float = Field(default=300.0, gt=0)
    leeway_s: float = Field(default=30.0, ge=0, le=300, description="clock skew allowed")
    user_claim: str = "sub"
    team_claim: str = "groups"
    team_map: dict[str, str] = Field(
        default_factory=dict, description="claim value -> team name (else used as is)")
    admin_claim: str = "groups"
    admin_values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _checks(self) -> OidcAuth:
        bad = [a for a in self.algorithms if a not in OIDC_ALGORITHMS]
        if bad:
            raise ValueError(f"algorithms: {bad} not allowed; use asymmetric ones "
                             f"{list(OIDC_ALGORITHMS)}")
        for field in ("issuer", "jwks_url"):
            url = getattr(self, field)
            if url is None or url.startswith("https://"):
                continue
            host = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)[0]
            if not (url.startswith("http://") and is_loopback(host.strip("[]"))):
                raise ValueError(f"{field}: '{url}' must be https:// (http only on loopback)")
        return self


class Auth(_Strict):
    mode: Literal["none", "token"] = "token"
    tokens: list[ApiToken] = Field(default_factory=list)
    oidc: OidcAuth | None = None


class Server(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    metrics_auth: bool = False
    """/metrics asks for a bearer token (any known one; give the scraper its own)."""


class Limits(_Strict):
    """What this installation accepts in one job, checked at submit (a 422 naming the field
    and the limit). Each may be raised up to the spec's hard ceiling (`spec.Ceiling`)."""

    max_replicas: int = Field(default=512, ge=1, le=Ceiling.REPLICAS)
    max_gpus_per_job: int = Field(default=4096, ge=1)
    max_runtime: RuntimeDuration = 30 * DAY  # also bounds checkpoint.interval
    max_checkpoint_grace: GraceDuration = 3600
    max_retry_backoff: BackoffDuration = DAY  # retry.backoff and retry.max_backoff
    max_cpus_per_replica: int = Field(default=1024, ge=1, le=Ceiling.CPUS_PER_REPLICA)
    max_memory_per_replica: MemorySize = 16 * 2**40  # 16Ti: what a large node offers
    max_wasted_gpu_hours: float = Field(
        default=1_000_000, gt=0, le=Ceiling.WASTED_GPU_HOURS, allow_inf_nan=False
    )


class Control(_Strict):
    """The control loop's pace and patience (seconds)."""

    enabled: bool = True
    admission_interval: float = Field(default=5.0, gt=0)
    dispatch_interval: float = Field(default=2.0, gt=0)
    reconcile_interval: float = Field(default=5.0, gt=0)
    lease_ttl: float = Field(default=15.0, gt=0)
    lost_grace: float = Field(default=120.0, ge=0)
    inventory_wait: float = Field(default=1.0, gt=0, le=60)
    """How long an admission cycle waits for the backends' inventories (asked all at once)."""
    inventory_max_age: float = Field(default=60.0, ge=0)
    """A backend slower than inventory_wait is served from its last good inventory up to this
    old; older, its pools are unavailable (BackendUnavailable)."""
    observe_timeout: float = Field(default=60.0, gt=0)
    """A reconciler waits this long for its backend's observe call, then keeps the jobs'
    reason as BackendUnavailable and tries again next pass."""
    backend_lock_wait: float = Field(default=10.0, gt=0)
    """How long submit, lookup and cancel wait for an adapter busy with another call."""
    decision_retention: float = Field(default=7 * 86400.0, gt=0, le=366 * 86400.0)
    """Admission cycles and their logged decisions older than this are pruned (seconds)."""
    decision_prune_batch: int = Field(default=500, ge=1, le=100_000)
    """Cycles deleted per pruning transaction (a pass runs at most 20 of them)."""


class Tenancy(_Strict):
    """What one team may put into the objects its jobs become, checked at submit (422).

    `reserved_key_prefixes`: label and annotation keys jobs may not set (other controllers and
    the node act on them); `exempt_key_prefixes` re-allows narrower prefixes (the local test
    cluster scripts its fake pods with `isthmus.io/fake-` annotations). `mounts`: per team, the
    volume (PersistentVolumeClaim) names its jobs may mount; a team not listed mounts none."""

    reserved_key_prefixes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RESERVED_PREFIXES))
    exempt_key_prefixes: list[str] = Field(default_factory=list)
    mounts: dict[str, list[str]] = Field(default_factory=dict, description="team -> claims")


class PriorityClass(_Strict):
    name: str = Field(pattern=NAME)
    value: int
    preempting: bool = False
    preempt_across_teams: bool = Field(
        default=False,
        description="may preempt another team's job that runs within its team's nominal "
        "quota (by default a preempting class stops only its own team's lower-priority jobs "
        "and other teams' jobs running on borrowed quota)")
    teams: list[str] | None = Field(
        default=None, max_length=1000,
        description="the teams whose jobs may use this class (unset: every team)")
    approval: Literal["none", "required"] = Field(
        default="none",
        description="required: a job of this class waits QUEUED (AwaitingApproval) until an "
        "admin approves it (POST /v1/admin/jobs/{id}/approve) or refuses it (/refuse)")


class Flavor(_Strict):
    name: str = Field(pattern=NAME)
    gpu_model: str
    gpu_memory_gb: int = Field(ge=1)
    interconnect: str | None = None
    cost_weight: float = Field(default=1.0, gt=0)


class Backend(_Strict):
    name: str = Field(pattern=NAME)
    kind: BackendKind
    settings: dict[str, Any] = Field(default_factory=dict, description="backend-specific")

    @property
    def serves_as(self) -> BackendKind:
        """The kind jobs see and ask for (`JobSpec.backend`): a simulated backend's `emulate`
        setting (slurm unless it says k8s; `check_backends` refuses other values)."""
        if self.kind is BackendKind.SIM:
            return BackendKind.K8S if self.settings.get("emulate") == "k8s" else BackendKind.SLURM
        return self.kind

    @property
    def runs_images(self) -> bool:
        """Whether its pools can run a job's entrypoint.image: a Kubernetes backend always; a
        Slurm one only with a `container.runtime` other than none (the default); a simulated
        one unless its `container.runtime` says none. (The backend validates the setting.)"""
        if self.kind is BackendKind.K8S:
            return True
        container = self.settings.get("container")
        runtime = container.get("runtime", "none") if isinstance(container, dict) else None
        if self.kind is BackendKind.SIM:
            return runtime != "none" if container is not None else True
        return runtime not in (None, "none")


class PoolCapacity(_Strict):
    """Static shape of a pool, used to reject jobs that could never fit. Live capacity comes
    from the backend's inventory."""

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    nodes_per_rack: int | None = Field(default=None, ge=1)
    racks_per_block: int | None = Field(default=None, ge=1)
    cpus_per_node: int | None = Field(default=None, ge=1, le=1_000_000,
                                      description="the pool's largest node's CPUs")
    memory_per_node: MemorySize | None = Field(
        default=None, description="the pool's largest node's memory (e.g. 512Gi)")


class Pool(_Strict):
    name: str = Field(pattern=NAME)
    backend: str
    flavor: str
    partition: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    capacity: PoolCapacity | None = None
    cost_weight: float = Field(default=1.0, gt=0)
    shared: bool = True
    drained: bool = False


class Quota(_Strict):
    nominal: int = Field(ge=0, description="GPUs of this flavor the team owns")
    borrowing_limit: int | None = Field(default=None, ge=0, description="None: unlimited")
    lending_limit: int | None = Field(default=None, ge=0, description="None: all of nominal")


class Cohort(_Strict):
    name: str = Field(pattern=NAME)


MAX_CONCURRENT_JOBS = 1_000_000
MAX_CONCURRENT_GPUS = 10_000_000


class ConcurrencyLimits(_Strict):
    """At most this many at once (unset: no limit). Running jobs and GPUs held (ADMITTED,
    PREPARING, RUNNING) are checked at admission: the job waits QUEUED with ConcurrencyLimit.
    Queued jobs (SUBMITTED, VALIDATING, QUEUED, RETRYING) are checked at submit: a 429."""

    running_jobs: int | None = Field(default=None, ge=0, le=MAX_CONCURRENT_JOBS)
    queued_jobs: int | None = Field(default=None, ge=0, le=MAX_CONCURRENT_JOBS)
    gpus: int | None = Field(default=None, ge=0, le=MAX_CONCURRENT_GPUS,
                             description="GPUs held by admitted and running jobs")

    def merged(self, fallback: ConcurrencyLimits) -> ConcurrencyLimits:
        """These limits, each unset one taken from `fallback`."""
        return ConcurrencyLimits(
            running_jobs=self.running_jobs if self.running_jobs is not None
            else fallback.running_jobs,
            queued_jobs=self.queued_jobs if self.queued_jobs is not None
            else fallback.queued_jobs,
            gpus=self.gpus if self.gpus is not None else fallback.gpus,
        )


MAX_BUDGET_GPU_HOURS = 1e9
MAX_BUDGETS = 3  # one per period
MAX_WARN_AT = 8


class Budget(_Strict):
    """GPU-hours per period (UTC day, ISO week from Monday, calendar month), counted from the
    ledger's usage entries (an attempt's hours count when it ends). Past each `warn_at`
    fraction a notice, a log line and the metric tell; at 1.0 `enforce` applies until the
    period renews: `stop` admits nothing new (BudgetExhausted), `lowest` admits only at the
    lowest priority class, never preempting."""

    period: Literal["day", "week", "month"]
    gpu_hours: float = Field(gt=0, le=MAX_BUDGET_GPU_HOURS)
    warn_at: list[float] = Field(
        default_factory=lambda: [0.8], max_length=MAX_WARN_AT,
        description="fractions of gpu_hours (each in (0, 1)) past which a warning is given")
    enforce: Literal["stop", "lowest"] = "stop"

    @model_validator(mode="after")
    def _fractions(self) -> Budget:
        bad = [w for w in self.warn_at if not 0 < w < 1]
        if bad:
            raise ValueError(f"warn_at: {bad[0]} is not a fraction in (0, 1); write e.g. 0.8 "
                             "for 80% (reaching 1.0 is always told)")
        if len(set(self.warn_at)) != len(self.warn_at):
            raise ValueError("warn_at: a fraction is given twice")
        return self


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class Smtp(_Strict):
    """The mail server notices are sent through (plain SMTP, optionally STARTTLS and login).
    The password is read from the environment variable `password_env`, never from this file."""

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(default=25, ge=1, le=65535)
    sender: EmailAddress = Field(description="the From: address")
    starttls: bool = False
    username: str | None = Field(default=None, max_length=255)
    password_env: str | None = Field(default=None, pattern=ENV_NAME)
    timeout: float = Field(default=10.0, gt=0, le=120)


class Notices(_Strict):
    """How notices are delivered (broker/control/notices.py): by the leader, every
    `interval`, at most `batch` deliveries a pass; a failed delivery is tried again after
    `backoff`, doubled each time up to `max_backoff`, until `max_attempts` (then it is dead:
    `isthmus admin notices --dead`)."""

    interval: float = Field(default=2.0, gt=0, le=3600)
    batch: int = Field(default=100, ge=1, le=10_000)
    timeout: float = Field(default=10.0, gt=0, le=120, description="per webhook call")
    max_attempts: int = Field(default=8, ge=1, le=50)
    backoff: float = Field(default=5.0, gt=0, le=3600)
    max_backoff: float = Field(default=900.0, gt=0, le=86400)
    signing_secret_env: str | None = Field(
        default=None, pattern=ENV_NAME,
        description="environment variable holding the HMAC-SHA256 key of the "
        "X-Isthmus-Signature header (unset: bodies are not signed)")
    smtp: Smtp | None = Field(default=None, description="unset: mail targets are not sent to")
    job_webhook_hosts: list[str] = Field(
        default_factory=list, max_length=256,
        description="hosts a job's own webhooks (spec `notify.webhooks`) may name; empty: "
        "jobs may name none (the broker would otherwise call any address a user writes)")


MAX_TEAM_QUEUES = 64
DEFAULT_QUEUE = "default"  # a job's queue when it names none (JobSpec.queue)
MAX_WEIGHT = 1e6


class TeamQueue(_Strict):
    """A queue inside a team (a project or sub-team; Kueue's LocalQueue, Slurm's sub-account):
    the team's jobs naming it (spec `queue`) share the team's quota with its other queues in
    proportion to their weights. Admission takes a team's next job from the queue with the
    lowest GPUs held per unit of weight (within one priority level). A `share` caps the queue
    (Slurm's sub-account GrpTRES, KAI's queue limit): per flavor, its jobs hold at most that
    fraction of what the team may hold (policies/queue_share.py). Shares are caps, not
    guarantees: a team's shares may add up to more than 1."""

    name: str = Field(pattern=NAME)
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT,
                          description="fair-share weight among the team's queues")
    share: float | None = Field(
        default=None,
        description="the most of the team's quota this queue's jobs may hold at once, per "
        "flavor (0 < share <= 1; unset: no cap beyond the team's)")

    @field_validator("share")
    @classmethod
    def _fraction(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 1:  # NaN fails this too
            raise ValueError(f"{v:g} is not a fraction of the team's quota: give 0 < share <= 1 "
                             "(0.5 for half), or leave it unset for no cap")
        return v


class Team(_Strict):
    name: str = Field(pattern=NAME)
    cohort: str | None = None
    weight: float = Field(
        default=1.0, gt=0, le=MAX_WEIGHT,
        description="fair-share weight among teams: a team of weight 2 may use twice the "
        "share of its quota before others go ahead of it")
    queues: list[TeamQueue] = Field(
        default_factory=list, max_length=MAX_TEAM_QUEUES,
        description="the team's queues (a job names one in `queue`); unset: one queue, "
        "'default', and a job's `queue` is a free label")

    def queue_of(self, label: str) -> str:
        """The queue a job's `queue` label waits in: itself when the team configures queues,
        else the team's one queue (the label is then free text, as before queues existed)."""
        return label if self.queues else DEFAULT_QUEUE

    def queue_names(self) -> list[str]:
        return [q.name for q in self.queues] or [DEFAULT_QUEUE]

    def queue_weights(self) -> dict[str, float]:
        return {q.name: q.weight for q in self.queues} or {DEFAULT_QUEUE: 1.0}

    def queue_shares(self) -> dict[str, float]:
        """The queues with a share, and their shares."""
        return {q.name: q.share for q in self.queues if q.share is not None}

    @property
    def splits_quota(self) -> bool:
        """The team's quota is split among queues: two queues or more, or a queue with a share
        (views and explain show the queues of such teams only)."""
        return len(self.queues) > 1 or any(q.share is not None for q in self.queues)
    quotas: dict[str, Quota] = Field(default_factory=dict, description="by flavor name")
    limits: ConcurrencyLimits = Field(
        default_factory=ConcurrencyLimits, description="the whole team's jobs at once")
    user_limits: ConcurrencyLimits = Field(
        default_factory=ConcurrencyLimits,
        description="each user's jobs in this team at once; unset fields come from the "
        "top-level user_limits")
    notices: Subscription | None = Field(
        default=None, description="webhooks and mail addresses told of this team's jobs")
    budgets: list[Budget] = Field(
        default_factory=list, max_length=MAX_BUDGETS,
        description="the whole team's GPU-hours per period (one budget per period)")
    user_budgets: list[Budget] = Field(
        default_factory=list, max_length=MAX_BUDGETS,
        description="each user's GPU-hours in this team per period (one budget per period)")
    native: NativePolicy | None = Field(
        default=None, description="backend-native options this team's jobs may pass "
        "(broker/config_native.py); unset: none")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class IsthmusConfig(_Strict):
    server: Server = Field(default_factory=Server)
    database: str = "sqlite:///isthmus.db"
    auth: Auth = Field(default_factory=Auth)
    limits: Limits = Field(default_factory=Limits)
    control: Control = Field(default_factory=Control)
    tenancy: Tenancy = Field(default_factory=Tenancy)
    policies: Policies = Field(default_factory=Policies)
    priority_classes: list[PriorityClass] = Field(
        default_factory=lambda: [
            PriorityClass(name="low", value=0),
            PriorityClass(name="normal", value=100),
            PriorityClass(name="high", value=1000, preempting=True),
        ]
    )
    flavors: list[Flavor] = Field(default_factory=list)
    backends: list[Backend] = Field(default_factory=list)
    pools: list[Pool] = Field(default_factory=list)
    cohorts: list[Cohort] = Field(default_factory=list)
    teams: list[Team] = Field(default_factory=list)
    user_limits: ConcurrencyLimits = Field(
        default_factory=ConcurrencyLimits,
        description="each user's jobs at once, in every team (teams[].user_limits overrides)")
    notices: Notices = Field(default_factory=Notices)
    slurm_compat: SlurmCompat | None = Field(
        default=None, description="how isbatch maps sbatch requests (broker/config_slurm_compat.py)"
    )
    templates: list[JobTemplate] = Field(
        default_factory=list, max_length=200,
        description="vetted job presets users submit with a name, a team and the overrides "
        "each allows (broker/config_templates.py)")

    @model_validator(mode="before")
    @classmethod
    def _fold_legacy_keys(cls, data: Any) -> Any:
        """The older spellings `control.preemption_min_runtime` and
        `control.preemption_protect_near_end` are moved into `policies.preemption` before
        validation, so that every reader (the server, `config check --show`) sees the one
        value in effect; given both ways with different values, the file is refused."""
        if not isinstance(data, dict) or not isinstance(data.get("control"), dict):
            return data
        control = dict(data["control"])
        policies = dict(data.get("policies") or {})
        if not isinstance(policies.get("preemption", {}), dict):
            return data  # the section's own validation names the problem
        preemption = dict(policies.get("preemption") or {})
        for old, new in (("preemption_min_runtime", "min_runtime"),
                         ("preemption_protect_near_end", "protect_near_end")):
            if old not in control:
                continue
            value = control.pop(old)
            if new in preemption and preemption[new] != value:
                raise ValueError(
                    f"control.{old} ({value}) and policies.preemption.{new} "
                    f"({preemption[new]}) disagree; keep only policies.preemption.{new}")
            preemption[new] = value
        return {**data, "control": control,
                "policies": {**policies, "preemption": preemption}}

    @model_validator(mode="after")
    def _references(self) -> IsthmusConfig:
        problems = [*self._duplicates(), *self._dangling(), *self._budget_periods(),
                    *self._template_problems()]
        if self.auth.mode == "none" and not is_loopback(self.server.host):
            problems.append(
                f"auth.mode: 'none' is allowed only on a loopback listener, and server.host is "
                f"'{self.server.host}'; use host 127.0.0.1 or set auth.mode: token"
            )
        if self.slurm_compat is not None:
            problems += self.slurm_compat.problems(
                {f.name for f in self.flavors}, {t.name: t.queue_names() for t in self.teams},
                {p.name for p in self.priority_classes}
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _duplicates(self) -> list[str]:
        problems = []
        for label, items in (
            ("flavors", self.flavors), ("backends", self.backends), ("pools", self.pools),
            ("cohorts", self.cohorts), ("teams", self.teams),
            ("priority_classes", self.priority_classes),
        ):
            names = [i.name for i in items]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                problems.append(f"{label}: duplicate name(s) {dup}")
        return problems

    def _template_problems(self) -> list[str]:
        """Each template's teams exist and its spec is a valid job once a name and a team are
        given (checked with its first allowed team), so a user never meets a broken preset."""
        from broker.domain.spec import JobSpec

        problems = []
        teams = [t.name for t in self.teams]
        names = [t.name for t in self.templates]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"templates: duplicate name '{dup}'")
        for i, tpl in enumerate(self.templates):
            unknown = sorted(set(tpl.teams or ()) - set(teams))
            if unknown:
                problems.append(f"templates[{i}].teams: {unknown} are not in teams")
                continue
            team = (tpl.teams or teams or ["any-team"])[0]
            try:
                spec = JobSpec.model_validate(fill(tpl, tpl.name, team, {}))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                problems.append(f"templates[{i}].spec.{where}: {first['msg']}")
                continue
            lacking = [t.name for t in self.teams if (tpl.teams is None or t.name in tpl.teams)
                       and t.queues and spec.queue not in t.queue_names()]
            if lacking:
                problems.append(f"templates[{i}].spec.queue: '{spec.queue}' is not a queue of "
                                f"team(s) {', '.join(lacking)} (teams[].queues)")
        return problems

    def template(self, name: str) -> JobTemplate | None:
        return next((t for t in self.templates if t.name == name), None)

    def _budget_periods(self) -> list[str]:
        problems = []
        for i, t in enumerate(self.teams):
            for label, budgets in (("budgets", t.budgets), ("user_budgets", t.user_budgets)):
                seen: set[str] = set()
                for j, b in enumerate(budgets):
                    if b.period in seen:
                        problems.append(f"teams[{i}].{label}[{j}].period: a second '{b.period}' "
                                        "budget; give one budget per period")
                    seen.add(b.period)
        return problems

    def _dangling(self) -> list[str]:
        """References to a flavor, backend, cohort or team that is not defined."""
        problems = []
        flavors = {f.name for f in self.flavors}
        backends = {b.name for b in self.backends}
        cohorts = {c.name for c in self.cohorts}
        teams = {t.name for t in self.teams}
        for i, p in enumerate(self.pools):
            if p.backend not in backends:
                problems.append(f"pools[{i}].backend: '{p.backend}' is not in backends")
            if p.flavor not in flavors:
                problems.append(f"pools[{i}].flavor: '{p.flavor}' is not in flavors")
        for i, t in enumerate(self.teams):
            names = [q.name for q in t.queues]
            problems += [f"teams[{i}].queues: duplicate name '{n}'"
                         for n in sorted({n for n in names if names.count(n) > 1})]
            if t.cohort is not None and t.cohort not in cohorts:
                problems.append(f"teams[{i}].cohort: '{t.cohort}' is not in cohorts")
            problems += [f"teams[{i}].quotas.{f}: '{f}' is not in flavors"
                         for f in t.quotas if f not in flavors]
        problems += [f"tenancy.mounts.{team}: '{team}' is not in teams"
                     for team in self.tenancy.mounts if team not in teams]
        problems += [f"auth.tokens[{i}].team: '{tok.team}' is not in teams"
                     for i, tok in enumerate(self.auth.tokens)
                     if tok.team is not None and tok.team not in teams]
        return problems

    # look-ups used on every request; the lists are short
    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)

    def flavor(self, name: str) -> Flavor | None:
        return next((f for f in self.flavors if f.name == name), None)

    def priority_class(self, name: str) -> PriorityClass | None:
        return next((p for p in self.priority_classes if p.name == name), None)

    def lowest_priority_class(self) -> PriorityClass | None:
        """The class of the lowest value (the first of them): what a spent GPU-hour budget
        with `enforce: lowest` admits at."""
        return min(self.priority_classes, key=lambda p: p.value, default=None)

    def user_limits_of(self, team: str) -> ConcurrencyLimits:
        t = self.team(team)
        return t.user_limits.merged(self.user_limits) if t else self.user_limits

    def backend(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)


def config_path(loc: tuple[int | str, ...]) -> str:
    """A place in isthmus.yaml as every message here writes it: `pools[0].capacity.nodes`."""
    out = ""
    for part in loc:
        if part == "__root__":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for err in exc.errors():
        loc = config_path(err["loc"])
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "(top level)")
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return lines


def parse_config(data: Any, source: str = "config") -> IsthmusConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        return IsthmusConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(f"{source}: {line}" for line in format_validation_error(exc))
        ) from None


def load_config(path: str | Path) -> IsthmusConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    return parse_config(data, str(p))
