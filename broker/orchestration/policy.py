"""The rule list: which rules guard the lifecycle, in order. The rule machinery (rules.py)
knows none of them, so a rule module may import the machinery without an import circle."""

from __future__ import annotations

from broker.domain import JobState
from broker.orchestration.ledger_rules import ReleaseOnLeave, ReserveOnAdmission
from broker.orchestration.metrics_rule import MetricsRule
from broker.orchestration.notice_rule import NoticeRule
from broker.orchestration.rules import RetryEngineOnlyRule, RuleSet
from broker.orchestration.story_rule import StoryRule


def default_rules() -> RuleSet:
    return RuleSet(
        [
            RetryEngineOnlyRule(JobState.FAILED, JobState.RETRYING,
                                "a failed job is retried only on a decision of the retry engine"),
            RetryEngineOnlyRule(JobState.RETRYING, JobState.FAILED,
                                "a job waiting for its retry fails only on a decision of the "
                                "retry engine"),
            ReserveOnAdmission(), ReleaseOnLeave(), MetricsRule(), StoryRule(), NoticeRule(),
        ]
    )
