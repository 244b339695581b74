"""Slurm's time strings, read and written in one place (broker.domain.slurm_time): what sbatch
reads, what sacct and scontrol write (long form) and what squeue writes (short form)."""

from __future__ import annotations

import pytest

from backends.slurm.parse import _limit_seconds
from broker.domain import slurm_time
from broker.sbatch.values import SbatchError, parse_time


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90 * 60), ("1:30", 90), ("1:02:03", 3723), ("2-3", (2 * 24 + 3) * 3600),
    ("2-3:04", (2 * 24 + 3) * 3600 + 240), ("1-00:00:05", 86405), ("1-", 86400),
    ("1:90", 150), ("UNLIMITED", None), ("infinite", None),
])
def test_sbatch_forms_read_as_slurm_reads_them(text: str, seconds: int | None) -> None:
    assert slurm_time.parse(text) == seconds
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2:3:4", "a", "1-2:3:4:5", "-5", "1.5", "1\n:00", "٣"])
def test_anything_else_is_refused_with_sbatchs_words(text: str) -> None:
    with pytest.raises(ValueError):
        slurm_time.parse(text)
    with pytest.raises(SbatchError, match="Invalid --time-min specification"):
        parse_time(text, "--time-min")


@pytest.mark.parametrize("seconds", [0, 59, 61, 3599, 3600, 86399, 86400, 9 * 86400 + 1])
def test_what_is_written_reads_back(seconds: int) -> None:
    for form in (slurm_time.long_form, slurm_time.short_form):
        assert slurm_time.parse(form(seconds)) == seconds, form(seconds)
        assert _limit_seconds(form(seconds)) == seconds


def test_the_forms_are_slurms() -> None:
    assert [slurm_time.short_form(s) for s in (5, 65, 3723, 90061)] == \
        ["0:05", "1:05", "1:02:03", "1-01:01:01"]
    assert [slurm_time.long_form(s) for s in (5, 3723, 90061)] == \
        ["00:00:05", "01:02:03", "1-01:01:01"]
    assert slurm_time.long_form(-3) == "00:00:00"


def test_sacct_words_that_are_no_limit_read_as_none() -> None:
    assert [_limit_seconds(t) for t in ("UNLIMITED", "Partition_Limit", "INVALID", "")] == \
        [None, None, None, None]
