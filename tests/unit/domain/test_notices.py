"""Which changes tell which notice kind, sbatch's mail types, the targets' bounds, the
back-off, and the submit-time check of a job's own webhook hosts."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from broker.config import parse_config
from broker.domain import JobState, Reason
from broker.domain.notices import (
    JobNotify,
    NoticeKind,
    kind_of,
    kinds_of_mail_type,
    redacted,
    retry_delay,
)
from broker.domain.spec import JobSpec
from broker.feasibility import request_problems
from tests.builders import spec
from tests.harness.sim import CONFIG

S, K, R = JobState, NoticeKind, Reason


@pytest.mark.parametrize(("src", "dst", "old", "reason", "kind"), [
    (S.PREPARING, S.RUNNING, "WaitingForAllRanks", R.Running, K.started),
    (S.RUNNING, S.RUNNING, "Running", R.Running, None),
    (S.RUNNING, S.SUCCEEDED, "Running", R.Succeeded, K.succeeded),
    (S.RUNNING, S.FAILED, "Running", R.UserError, K.failed),
    (S.VALIDATING, S.REJECTED, "Validating", R.ExceedsCapacity, K.failed),
    (S.QUEUED, S.CANCELLED, "QuotaExhausted", R.CancelledByUser, K.cancelled),
    (S.RUNNING, S.RETRYING, "Running", R.Preempted, K.preempted),
    (S.ADMITTED, S.QUEUED, "Admitted", R.Preempted, K.preempted),
    (S.FAILED, S.RETRYING, "InfraTransient", R.InfraTransient, K.requeued),
    (S.RETRYING, S.QUEUED, "InfraTransient", R.BackoffAfterFailure, None),
    (S.QUEUED, S.QUEUED, "QuotaExhausted", R.AwaitingApproval, K.approval_needed),
    (S.QUEUED, S.QUEUED, "AwaitingApproval", R.AwaitingApproval, None),
    (S.QUEUED, S.QUEUED, "AwaitingApproval", R.Approved, K.approval_decided),
    (S.QUEUED, S.QUEUED, "Approved", R.Approved, None),
    (S.QUEUED, S.CANCELLED, "AwaitingApproval", R.ApprovalRefused, K.approval_decided),
    (S.QUEUED, S.ADMITTED, "QuotaExhausted", R.Admitted, None),
], ids=lambda v: getattr(v, "value", v))
def test_kind_of(src: JobState, dst: JobState, old: str, reason: Reason,
                 kind: NoticeKind | None) -> None:
    assert kind_of(src, dst, old, reason) == kind


def test_mail_types_as_sbatch_defines_them() -> None:
    assert kinds_of_mail_type("END") == {K.succeeded, K.failed, K.cancelled}
    assert kinds_of_mail_type("begin,fail") == {K.started, K.failed}
    assert kinds_of_mail_type("ALL") == set(NoticeKind)
    assert kinds_of_mail_type("NONE") == set()
    assert kinds_of_mail_type("TIME_LIMIT_80") == set()  # accepted, no event behind it here
    with pytest.raises(ValueError, match="--mail-type: unknown type 'SOON'"):
        kinds_of_mail_type("END,SOON")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("webhooks", ["ftp://host/x"], "not an http"),
    ("webhooks", ["https://user:pw@host/x"], "may not carry credentials"),
    ("webhooks", ["https://h/" + "x" * 2100], "at most 2048"),
    ("webhooks", [f"https://h{i}.example.org/" for i in range(5)], "at most 4"),
    ("emails", ["not-an-address"], "not a mail address"),
    ("events", ["sometimes"], "events"),
], ids=["scheme", "credentials", "long", "too-many", "email", "kind"])
def test_a_jobs_notify_is_bounded(field: str, value: list[str], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        JobNotify.model_validate({field: value})


def test_logs_show_a_webhook_by_its_host_only() -> None:
    assert redacted("https://hooks.example.org:8443/T0/B1/secret?x=1") == \
        "https://hooks.example.org:8443/..."


def test_back_off_doubles_up_to_its_cap() -> None:
    assert [retry_delay(n, 5, 60) for n in (1, 2, 3, 4, 5, 99)] == [5, 10, 20, 40, 60, 60]


def test_a_jobs_webhook_must_name_an_allowed_host() -> None:
    raw = copy.deepcopy(CONFIG)
    raw["notices"] = {"job_webhook_hosts": ["hooks.example.org"]}
    config = parse_config(raw)
    job = JobSpec.model_validate(spec().name("x").flavors("a100-80g").set(
        "notify", {"webhooks": ["https://hooks.example.org/a", "http://10.0.0.1/b"]})
        .build().model_dump())
    problems = request_problems(config, job, None)
    assert [p.field for p in problems] == ["notify.webhooks[1]"]
    assert "host '10.0.0.1' is not in notices.job_webhook_hosts" in problems[0].message


def test_team_notices_in_the_configuration_are_checked() -> None:
    raw = copy.deepcopy(CONFIG)
    raw["teams"][0]["notices"] = {"webhooks": ["gopher://x"]}
    with pytest.raises(Exception, match=r"teams\.0\.notices\.webhooks|teams\[0\]"):
        parse_config(raw)
