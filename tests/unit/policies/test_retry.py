"""The retry matrix: category x counts x budget -> decision."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from broker.domain import FailureCategory, Reason
from broker.domain.spec import RetryPolicy
from policies.retry import AttemptCounts, RetryParams, backoff_delay, decide_retry

C = FailureCategory
POLICY = RetryPolicy(max_attempts=3, backoff=30, max_backoff=100, max_wasted_gpu_hours=50)


@dataclass
class Case:
    id: str
    category: C | None
    counts: AttemptCounts
    retry: bool
    reason: Reason
    delay: int = 0
    pools: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()
    wasted: float = 0.0
    preempted: bool = False
    failed_nodes: tuple[str, ...] = ("n1",)
    counts_as_failure: bool = True
    in_message: str = ""


def n(failures: int = 1, cat: C | None = None, in_pool: int = 1, **kw: int) -> AttemptCounts:
    by = {cat: kw.get("seen", failures)} if cat else {}
    return AttemptCounts(
        failures=failures,
        by_category=by,
        failures_in_pool=in_pool,
        preemptions=kw.get("preemptions", 0),
    )


CASES = [
    Case("user-error-never", C.USER_ERROR, n(1), False, Reason.UserError),
    Case(
        "infra-first-excludes-node",
        C.INFRA_TRANSIENT,
        n(1, C.INFRA_TRANSIENT),
        True,
        Reason.InfraTransient,
        delay=30,
        nodes=frozenset({"n1"}),
        in_message="avoiding node n1",
    ),
    Case(
        "infra-backoff-doubles",
        C.INFRA_TRANSIENT,
        n(2, C.INFRA_TRANSIENT, in_pool=1),
        True,
        Reason.InfraTransient,
        delay=60,
        nodes=frozenset({"n1"}),
    ),
    Case(
        "infra-repeated-in-pool-excludes-pool",
        C.INFRA_TRANSIENT,
        n(2, C.INFRA_TRANSIENT, in_pool=2),
        True,
        Reason.InfraTransient,
        delay=60,
        pools=frozenset({"p1"}),
        nodes=frozenset({"n1"}),
    ),
    Case(
        "infra-without-node-excludes-pool",
        C.INFRA_TRANSIENT,
        n(1, C.INFRA_TRANSIENT),
        True,
        Reason.InfraTransient,
        delay=30,
        pools=frozenset({"p1"}),
        failed_nodes=(),
    ),
    Case(
        "backoff-is-capped",
        C.INFRA_TRANSIENT,
        AttemptCounts(failures=2, failures_in_pool=1),
        True,
        Reason.InfraTransient,
        delay=60,
        nodes=frozenset({"n1"}),
    ),
    Case(
        "resource-env-only-elsewhere",
        C.RESOURCE_ENV,
        n(1, C.RESOURCE_ENV),
        True,
        Reason.ResourceEnv,
        delay=30,
        pools=frozenset({"p1"}),
        nodes=frozenset({"n1"}),
    ),
    Case(
        "orchestration-once",
        C.ORCHESTRATION,
        n(1, C.ORCHESTRATION),
        True,
        Reason.Orchestration,
        delay=30,
    ),
    Case(
        "orchestration-not-twice",
        C.ORCHESTRATION,
        n(2, C.ORCHESTRATION),
        False,
        Reason.RetriesExhausted,
        in_message="2 ORCHESTRATION failures",
    ),
    Case(
        "unknown-once-avoiding-node",
        C.UNKNOWN,
        n(1, C.UNKNOWN),
        True,
        Reason.Unknown,
        delay=30,
        nodes=frozenset({"n1"}),
    ),
    Case("unknown-not-twice", C.UNKNOWN, n(2, C.UNKNOWN), False, Reason.RetriesExhausted),
    Case(
        "missing-category-is-unknown",
        None,
        n(1, C.UNKNOWN),
        True,
        Reason.Unknown,
        delay=30,
        nodes=frozenset({"n1"}),
    ),
    Case(
        "max-attempts-reached",
        C.INFRA_TRANSIENT,
        n(3, C.INFRA_TRANSIENT),
        False,
        Reason.RetriesExhausted,
        in_message="3 failed attempts, the policy allows 3",
    ),
    Case(
        "gpu-hours-budget",
        C.INFRA_TRANSIENT,
        n(1, C.INFRA_TRANSIENT),
        False,
        Reason.RetriesExhausted,
        wasted=51,
        in_message="51.0 GPU-hours",
    ),
    Case(
        "preemption-does-not-consume-attempts",
        None,
        n(3, preemptions=4),
        True,
        Reason.Preempted,
        preempted=True,
        counts_as_failure=False,
        in_message="attempt budget untouched",
    ),
    Case(
        "preemption-ignores-waste-budget",
        None,
        n(0, preemptions=1),
        True,
        Reason.Preempted,
        preempted=True,
        wasted=500,
        counts_as_failure=False,
    ),
    Case(
        "preemptions-are-bounded",
        None,
        n(0, preemptions=11),
        False,
        Reason.RetriesExhausted,
        preempted=True,
        counts_as_failure=False,
        in_message="preempted 11 times",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_retry_matrix(case: Case) -> None:
    d = decide_retry(
        POLICY,
        case.category,
        case.counts,
        case.wasted,
        preempted=case.preempted,
        pool="p1",
        nodes=case.failed_nodes,
    )
    assert (d.retry, d.reason) == (case.retry, case.reason), d.message
    assert d.delay_seconds == case.delay
    assert d.exclude_pools == case.pools
    assert d.exclude_nodes == case.nodes
    assert d.counts_as_failure == case.counts_as_failure
    assert case.in_message in d.message


def test_backoff_sequence_and_cap() -> None:
    policy = RetryPolicy(max_attempts=20, backoff=30, max_backoff=900)
    assert [backoff_delay(policy, k) for k in range(1, 8)] == [30, 60, 120, 240, 480, 900, 900]
    assert backoff_delay(policy, 10_000) == 900


def test_params_override_category_budgets() -> None:
    d = decide_retry(
        POLICY,
        C.ORCHESTRATION,
        n(2, C.ORCHESTRATION),
        0.0,
        params=RetryParams(orchestration_retries=2),
    )
    assert d.retry
