from __future__ import annotations

import pytest

from broker.domain import REASONS, FailureCategory, Reason, ReasonKind, most_severe
from broker.domain.reasons import FAILURE_REASON


def test_every_reason_has_info_and_camel_case_code() -> None:
    assert set(REASONS) == set(Reason)
    for r in Reason:
        assert r.value[0].isupper() and "_" not in r.value and " " not in r.value


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        ([Reason.FairShareBehind, Reason.QuotaExhausted], Reason.QuotaExhausted),
        ([Reason.InsufficientCapacity, Reason.TopologyUnsatisfiable], Reason.TopologyUnsatisfiable),
        ([Reason.PoolDrained, Reason.InsufficientCapacity, Reason.HigherPriorityAhead],
         Reason.PoolDrained),
        ([Reason.BackendUnavailable, Reason.NoFlavorFits], Reason.BackendUnavailable),
        ([Reason.ExceedsCapacity, Reason.NoQuotaInCohort], Reason.ExceedsCapacity),  # tie: by code
        ([], None),
    ],
    ids=["quota>fairshare", "topology>capacity", "drained>capacity", "unavailable>flavor",
         "tie-by-code", "empty"],
)
def test_most_severe(reasons: list[Reason], expected: Reason | None) -> None:
    assert most_severe(reasons) == expected
    assert most_severe(reversed(reasons)) == expected  # order of evidence does not matter


def test_wait_reasons_rank_below_failures_and_rejections() -> None:
    waits = [i.severity for i in REASONS.values() if i.kind is ReasonKind.WAIT]
    fails = [i.severity for i in REASONS.values() if i.kind is ReasonKind.FAILURE]
    rejects = [i.severity for i in REASONS.values() if i.kind is ReasonKind.REJECTION]
    assert max(waits) < min(fails) <= max(fails) < min(rejects)


def test_every_failure_category_has_a_reason() -> None:
    assert set(FAILURE_REASON) == set(FailureCategory)
