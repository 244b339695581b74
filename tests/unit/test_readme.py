"""The README's reason table and state table stay in step with the code."""

from __future__ import annotations

from pathlib import Path

from broker.domain import REASONS, JobState

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_reason_is_documented_with_its_severity() -> None:
    for reason, info in REASONS.items():
        assert f"| `{reason.value}` | {info.kind.value} | {info.severity} |" in README, reason


def test_every_state_is_documented() -> None:
    for state in JobState:
        assert state.value in README


def test_readme_names_exactly_two_setup_commands() -> None:
    assert "scripts/demo    #" in README and "scripts/test    #" in README
