"""Notices: what a job's subscribers are told, and when.

A notice is derived from one committed job event (broker/orchestration/notice_rule.py writes it
in the transaction of the change). `kind_of` is the one table from a change of state and reason
to a notice kind; `MAIL_TYPES` maps sbatch's `--mail-type` values onto those kinds.

| change | kind | sbatch --mail-type |
|---|---|---|
| -> RUNNING (from another state) | started | BEGIN |
| -> SUCCEEDED | succeeded | END |
| -> FAILED, -> REJECTED | failed (with its failure category) | FAIL, END |
| -> CANCELLED (not an approval refused) | cancelled | END |
| -> RETRYING (Preempted), -> QUEUED (Preempted) | preempted (with the grace left) | REQUEUE |
| -> RETRYING (any other reason) | requeued | REQUEUE |
| reason becomes AwaitingApproval | approval_needed | (ALL) |
| reason Approved, or CANCELLED (ApprovalRefused) | approval_decided | (ALL) |
| a team's budget threshold crossed | budget_threshold | (ALL) |

`budget_threshold` has no job event behind it: the admission cycle writes it
(broker/control/budgets.py) when a GPU-hour budget first reaches a fraction in a period (one per
budget, period and fraction: the key says which).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason
from broker.domain.states import JobState


class NoticeKind(StrEnum):
    started = "started"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    preempted = "preempted"
    requeued = "requeued"
    approval_needed = "approval_needed"
    approval_decided = "approval_decided"
    budget_threshold = "budget_threshold"


ALL_KINDS = frozenset(NoticeKind)

MAIL_TYPES: dict[str, frozenset[NoticeKind]] = {
    "NONE": frozenset(),
    "BEGIN": frozenset({NoticeKind.started}),
    "END": frozenset({NoticeKind.succeeded, NoticeKind.failed, NoticeKind.cancelled}),
    "FAIL": frozenset({NoticeKind.failed}),
    "REQUEUE": frozenset({NoticeKind.preempted, NoticeKind.requeued}),
    "ALL": ALL_KINDS,
    # Slurm's other types have no event here; accepted (scripts carry them) and without effect.
    "INVALID_DEPEND": frozenset(), "STAGE_OUT": frozenset(), "TIME_LIMIT": frozenset(),
    "TIME_LIMIT_90": frozenset(), "TIME_LIMIT_80": frozenset(), "TIME_LIMIT_50": frozenset(),
    "ARRAY_TASKS": frozenset(),
}
"""sbatch --mail-type values (comma-separated, any case) and the notice kinds each asks for."""


def kinds_of_mail_type(value: str) -> frozenset[NoticeKind]:
    """The kinds `--mail-type=value` asks for; ValueError naming an unknown type."""
    kinds: set[NoticeKind] = set()
    for part in value.split(","):
        name = part.strip().upper()
        if name not in MAIL_TYPES:
            raise ValueError(f"--mail-type: unknown type '{part.strip()}' (one of "
                             f"{', '.join(MAIL_TYPES)})")
        kinds |= MAIL_TYPES[name]
    return frozenset(kinds)


def kind_of(src: JobState, dst: JobState, old_reason: str, reason: Reason) -> NoticeKind | None:
    """The notice an accepted change (src, old_reason) -> (dst, reason) gives, if any."""
    if reason is Reason.ApprovalRefused or (reason is Reason.Approved
                                           and old_reason != Reason.Approved.value):
        return NoticeKind.approval_decided
    if reason is Reason.AwaitingApproval:
        return NoticeKind.approval_needed if old_reason != reason.value else None
    if src is dst:
        return None
    if reason is Reason.Preempted and dst in (JobState.RETRYING, JobState.QUEUED):
        return NoticeKind.preempted
    return {
        JobState.RUNNING: NoticeKind.started,
        JobState.SUCCEEDED: NoticeKind.succeeded,
        JobState.FAILED: NoticeKind.failed,
        JobState.REJECTED: NoticeKind.failed,
        JobState.CANCELLED: NoticeKind.cancelled,
        JobState.RETRYING: NoticeKind.requeued,
    }.get(dst)


_CATEGORY_OF_REASON = {
    Reason.UserError: FailureCategory.USER_ERROR,
    Reason.InfraTransient: FailureCategory.INFRA_TRANSIENT,
    Reason.ResourceEnv: FailureCategory.RESOURCE_ENV,
    Reason.Orchestration: FailureCategory.ORCHESTRATION,
}


def failure_category(attempt_failure: str | None, reason: str) -> str | None:
    """The failure category a `failed` notice names: the ended attempt's, else the one its
    reason says, else None (a job rejected or ended without an attempt that failed)."""
    if attempt_failure:
        return attempt_failure
    try:
        category = _CATEGORY_OF_REASON.get(Reason(reason))
    except ValueError:
        return None
    return category.value if category is not None else None


MAX_URL = 2048
MAX_EMAIL = 254
_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")


def _check_url(url: str) -> str:
    if len(url) > MAX_URL:
        raise ValueError(f"a webhook URL is at most {MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{redacted(url)}' is not an http(s) URL with a host; write "
                         "https://host/path")
    if parts.username or parts.password:
        raise ValueError("a webhook URL may not carry credentials (user:password@); sign the "
                         "body instead (notices.signing_secret_env)")
    return url


def _check_email(address: str) -> str:
    if len(address) > MAX_EMAIL or not _EMAIL.match(address):
        raise ValueError(f"'{address[:64]}' is not a mail address (write name@example.org)")
    return address


WebhookUrl = Annotated[str, AfterValidator(_check_url)]
"""An http(s) URL with a host and no credentials, at most MAX_URL characters."""
EmailAddress = Annotated[str, AfterValidator(_check_email)]


def redacted(url: str) -> str:
    """What logs and error messages show of a webhook URL: its scheme and host (paths and
    queries of webhook URLs often carry tokens)."""
    parts = urlsplit(url[:MAX_URL])
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}/..."


def webhook_host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


MAX_JOB_TARGETS = 4


class Subscription(BaseModel):
    """Who is told of which kinds: a job's (`notify:` in the spec) or a team's
    (`teams[].notices` in isthmus.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhooks: list[WebhookUrl] = Field(default_factory=list, max_length=8)
    emails: list[EmailAddress] = Field(default_factory=list, max_length=16)
    events: list[NoticeKind] = Field(
        default_factory=lambda: sorted(ALL_KINDS),
        description="the kinds to tell (default: every kind)")

    def wants(self, kind: NoticeKind) -> bool:
        return kind in self.events


class JobNotify(Subscription):
    """A job's own subscribers: at most MAX_JOB_TARGETS webhooks and mail addresses (webhook
    hosts must be allowed by `notices.job_webhook_hosts`)."""

    webhooks: list[WebhookUrl] = Field(default_factory=list, max_length=MAX_JOB_TARGETS)
    emails: list[EmailAddress] = Field(default_factory=list, max_length=MAX_JOB_TARGETS)


def retry_delay(attempts: int, backoff: float, max_backoff: float) -> float:
    """Seconds before the next try of a delivery that failed `attempts` times (>= 1): `backoff`
    doubled per failure after the first, at most `max_backoff`."""
    return min(backoff * 2.0 ** min(attempts - 1, 30), max_backoff)
