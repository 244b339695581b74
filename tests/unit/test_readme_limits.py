"""The README's Limits table stays in step with broker.config.Limits and spec.Ceiling."""

from __future__ import annotations

from pathlib import Path

from broker.config import Limits
from broker.domain.spec import Ceiling
from broker.domain.units import format_duration, format_size

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
DURATIONS = {"max_runtime", "max_checkpoint_grace", "max_retry_backoff"}


def _shown(name: str, value: float) -> str:
    if name in DURATIONS:
        return format_duration(int(value))
    if name == "max_memory_per_replica":
        return format_size(int(value))
    return str(int(value)) if float(value).is_integer() else str(value)


def test_every_limit_is_documented_with_its_default() -> None:
    defaults = Limits()
    for name in Limits.model_fields:
        row = f"| `{name}` | {_shown(name, getattr(defaults, name))} |"
        assert row in README, row


def test_ceilings_in_the_table_are_the_code_s() -> None:
    for name, ceiling in (
        ("max_replicas", Ceiling.REPLICAS),
        ("max_cpus_per_replica", Ceiling.CPUS_PER_REPLICA),
        ("max_memory_per_replica", Ceiling.MEMORY_PER_REPLICA),
        ("max_runtime", Ceiling.MAX_RUNTIME),
        ("max_checkpoint_grace", Ceiling.GRACE),
        ("max_retry_backoff", Ceiling.BACKOFF),
        ("max_wasted_gpu_hours", Ceiling.WASTED_GPU_HOURS),
    ):
        line = next(x for x in README.splitlines() if x.startswith(f"| `{name}` |"))
        assert line.rstrip().endswith(f"| {_shown(name, ceiling)} |"), line
