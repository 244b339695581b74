"""`teams[].budgets` and `teams[].user_budgets` in isthmus.yaml: bounded, and every refusal
names its field."""

from __future__ import annotations

from typing import Any

import pytest

from broker.config import ConfigError, parse_config


def _with(budgets: list[Any], key: str = "budgets") -> dict[str, Any]:
    return {"auth": {"mode": "none"}, "teams": [{"name": "vision", key: budgets}]}


def test_a_budget_with_its_defaults() -> None:
    team = parse_config(_with([{"period": "month", "gpu_hours": 5000}])).teams[0]
    [b] = team.budgets
    assert (b.period, b.gpu_hours, b.warn_at, b.enforce) == ("month", 5000, [0.8], "stop")


@pytest.mark.parametrize(
    ("budgets", "key", "words"),
    [
        ([{"period": "year", "gpu_hours": 1}], "budgets",
         r"teams\[0\]\.budgets\[0\]\.period: Input should be 'day', 'week' or 'month'"),
        ([{"period": "day", "gpu_hours": 0}], "budgets",
         r"teams\[0\]\.budgets\[0\]\.gpu_hours: Input should be greater than 0"),
        ([{"period": "day", "gpu_hours": 1e12}], "user_budgets",
         r"teams\[0\]\.user_budgets\[0\]\.gpu_hours: Input should be less than or equal"),
        ([{"period": "day", "gpu_hours": float("inf")}], "budgets",
         r"teams\[0\]\.budgets\[0\]\.gpu_hours"),
        ([{"period": "day", "gpu_hours": 1, "warn_at": [80]}], "budgets",
         r"teams\[0\]\.budgets\[0\]: warn_at: 80.0 is not a fraction in \(0, 1\)"),
        ([{"period": "day", "gpu_hours": 1, "warn_at": [0.5, 0.5]}], "budgets",
         r"warn_at: a fraction is given twice"),
        ([{"period": "day", "gpu_hours": 1, "enforce": "kill"}], "budgets",
         r"teams\[0\]\.budgets\[0\]\.enforce: Input should be 'stop' or 'lowest'"),
        ([{"period": "day", "gpu_hours": 1, "limit": 3}], "budgets",
         r"teams\[0\]\.budgets\[0\]\.limit: Extra inputs are not permitted"),
        ([{"period": "month", "gpu_hours": 1}, {"period": "month", "gpu_hours": 2}], "budgets",
         r"teams\[0\]\.budgets\[1\]\.period: a second 'month' budget; give one budget per "
         r"period"),
        ([{"period": p, "gpu_hours": 1} for p in ("day", "week", "month", "day")],
         "user_budgets", r"teams\[0\]\.user_budgets: List should have at most 3 items"),
    ],
    ids=["period", "zero", "too-many-hours", "infinite", "percent-not-fraction",
         "twice", "enforce", "unknown-key", "two-per-period", "too-many"],
)
def test_bad_budgets_are_refused_naming_the_field(budgets: list[Any], key: str,
                                                  words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config(_with(budgets, key))
