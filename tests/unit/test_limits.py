"""`limits:` in isthmus.yaml: human units, bounded by the spec's ceilings, checked at submit."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, IsthmusConfig, parse_config
from broker.feasibility import request_problems
from tests.builders import spec


def test_limits_take_the_spec_units() -> None:
    limits = parse_config({"limits": {"max_runtime": "14d", "max_checkpoint_grace": "10m",
                                      "max_memory_per_replica": "2Ti"}}).limits
    assert (limits.max_runtime, limits.max_checkpoint_grace) == (14 * 86400, 600)
    assert limits.max_memory_per_replica == 2 * 2**40


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("max_runtime", "400d", "at most 366d"),
        ("max_checkpoint_grace", "2d", "at most 1d"),
        ("max_retry_backoff", True, "boolean"),
        ("max_memory_per_replica", "2Pi", "at most 1Pi"),
        ("max_cpus_per_replica", 10**6, "less than or equal to 65536"),
        ("max_wasted_gpu_hours", float("inf"), "finite"),
    ],
)
def test_limits_cannot_exceed_the_ceilings(key: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=f"limits.{key}: .*{words}"):
        parse_config({"limits": {key: value}})


def test_a_lowered_limit_is_enforced_at_submit(example_config: IsthmusConfig) -> None:
    cfg = example_config.model_copy(
        update={"limits": parse_config({"limits": {"max_runtime": "4h"}}).limits}
    )
    ok = spec().set("max_runtime", "4h").build()
    assert request_problems(cfg, ok, None) == []
    problems = request_problems(cfg, spec().set("max_runtime", "5h").build(), None)
    assert [(p.field, p.message) for p in problems] == [(
        "max_runtime",
        "5h is above this installation's limit of 4h (limits.max_runtime); ask for at most 4h",
    )]
