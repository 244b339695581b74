"""Quotas: nominal, borrowing and lending limits, cohort exhaustion and reclaim, with numbers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from broker.domain import Reason
from policies.quota import QuotaState
from tests.unit.policies.builders import q, quota_config, usage

CONFIG = quota_config(
    {
        "vision": ("research", {"h100": q(16, borrow=8, lend=8)}),
        "language": ("research", {"h100": q(16)}),
        "solo": (None, {"h100": q(8)}),
    }
)


@dataclass
class Case:
    id: str
    team: str
    used: dict[str, int]
    gpus: int
    ok: bool
    reason: Reason
    borrowed: int = 0
    reclaim: int = 0
    in_message: str = ""
    flavor: str = "h100"


CASES = [
    Case("within-nominal", "vision", {}, 8, True, Reason.Admitted, in_message="within nominal"),
    Case(
        "borrow-within-limit",
        "vision",
        {"vision__h100": 16},
        8,
        True,
        Reason.Admitted,
        borrowed=8,
        in_message="borrows 8 from cohort research",
    ),
    Case(
        "borrow-limit-reached",
        "vision",
        {"vision__h100": 16},
        16,
        False,
        Reason.BorrowLimitReached,
        in_message="over its borrowing limit of 8 by 8",
    ),
    Case(
        "partly-borrowed-counts-only-the-excess",
        "vision",
        {"vision__h100": 12},
        8,
        True,
        Reason.Admitted,
        borrowed=4,
    ),
    Case(
        "no-cohort-no-borrowing",
        "solo",
        {"solo__h100": 8},
        1,
        False,
        Reason.QuotaExhausted,
        in_message="uses 8 of 8 nominal h100 GPUs and needs 1 more; it is in no cohort",
    ),
    Case("unknown-team", "ghost", {}, 1, False, Reason.QuotaExhausted, in_message="no quota"),
    Case(
        "flavor-without-quota",
        "vision",
        {},
        1,
        False,
        Reason.QuotaExhausted,
        in_message="borrowing limit is 0",
        flavor="a100",
    ),
    Case(
        "cohort-has-nothing-left-to-lend",
        "language",
        {"vision__h100": 16, "language__h100": 16},
        4,
        False,
        Reason.QuotaExhausted,
        in_message="0 h100 GPUs left to lend, short by 4",
    ),
    Case(
        "lending-limit-keeps-guaranteed-capacity",
        "language",
        {"language__h100": 24},
        1,
        False,
        Reason.QuotaExhausted,
        in_message="short by 1",
    ),
    Case(
        "lent-capacity-is-borrowable",
        "language",
        {"language__h100": 16},
        8,
        True,
        Reason.Admitted,
        borrowed=8,
    ),
    Case(
        "reclaim-needed-within-nominal",
        "vision",
        {"vision__h100": 8, "language__h100": 24},
        8,
        False,
        Reason.QuotaExhausted,
        reclaim=8,
        in_message="8 must be reclaimed",
    ),
    Case(
        "guaranteed-part-never-needs-reclaim",
        "vision",
        {"language__h100": 24},
        8,
        True,
        Reason.Admitted,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_quota_check(case: Case) -> None:
    state = QuotaState(CONFIG, usage(**case.used))
    v = state.check(case.team, case.flavor, case.gpus)
    assert (v.ok, v.reason) == (case.ok, case.reason), v.message
    assert v.borrowed == case.borrowed
    assert v.reclaim == case.reclaim
    assert case.in_message in v.message


def test_reserve_then_release_restores_the_cohort() -> None:
    state = QuotaState(CONFIG, usage())
    state.reserve("language", "h100", 24)
    assert state.check("language", "h100", 1).ok is False
    assert state.line("language", "h100").borrowed == 8
    state.release("language", "h100", 8)
    assert state.check("language", "h100", 8).ok is True
    with pytest.raises(ValueError, match="release of 100"):
        state.release("language", "h100", 100)


def test_reserving_in_order_exhausts_then_blocks() -> None:
    state = QuotaState(CONFIG, usage())
    answers = []
    for _ in range(4):
        v = state.check("vision", "h100", 8)
        answers.append(v.reason)
        if v.ok:
            state.reserve("vision", "h100", 8)
    # 16 nominal + 8 borrowing limit = 3 jobs of 8
    assert answers == [Reason.Admitted] * 3 + [Reason.BorrowLimitReached]
