"""Run-time prediction from history, for the queue estimate (policies/eta.py).

Declared limits (`max_runtime`) are over-estimates rounded up to a few familiar values, and
most jobs use a small, varying part of theirs (Tsafrir et al. 2007, "Backfilling using
system-generated predictions rather than user runtime estimates"). What a job will really run
is better told by what similar jobs ran here: this model keeps, per group of ended attempts,
the ratios of true to declared run time, and predicts a job's run as its declared limit times
the mean ratio of the most specific group that has enough samples (the mean, not the median:
a start waits for the sum of the runs ahead of it, and run times are skewed; measured in
bench/eta_accuracy.py, docs/benchmarks.md):

  1 the same team and the same declared limit
  2 the same declared limit (users pick a few round values; the value says much of the run)
  3 the same team
  4 every sample

A job with no group of `min_samples` (and a model with fewer samples than that) keeps its
declared limit. Work already running for `elapsed` seconds is predicted from the samples of
its group that ran longer than that (a job 5 h into an 8 h limit is not a typical job of the
group any more); when none did, it is expected at its declared end.

Pure: samples in, predictions out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_SAMPLES = 8
"""A group with fewer samples than this does not speak; the next coarser one does."""


@dataclass(frozen=True, slots=True)
class RunSample:
    """One ended attempt: who ran it, what it declared, what it ran (seconds)."""

    team: str
    declared_s: float
    ran_s: float


_Key = tuple[str, ...]


def _keys(team: str, declared_s: float) -> tuple[_Key, ...]:
    d = str(round(declared_s))
    return (("t", team, "d", d), ("d", d), ("t", team), ())


@dataclass(frozen=True, slots=True)
class RuntimeModel:
    """Sorted true/declared ratios per group (see the module doc)."""

    groups: dict[_Key, list[float]] = field(default_factory=dict)
    min_samples: int = MIN_SAMPLES

    @classmethod
    def learn(cls, samples: Iterable[RunSample], min_samples: int = MIN_SAMPLES) -> RuntimeModel:
        groups: dict[_Key, list[float]] = {}
        for s in samples:
            if s.declared_s <= 0 or s.ran_s < 0:
                continue  # bounded before use: a sample that cannot be a ratio is left out
            ratio = min(1.0, s.ran_s / s.declared_s)
            for k in _keys(s.team, s.declared_s):
                groups.setdefault(k, []).append(ratio)
        for v in groups.values():
            v.sort()
        return cls(groups, max(1, min_samples))

    @property
    def samples(self) -> int:
        return len(self.groups.get((), []))

    def factor(self) -> float:
        """The mean ratio over every sample (1.0 without enough of them): for work whose
        declared limit and team are not known, such as a backend's anonymous releases."""
        return _mean(self.groups.get((), []), self.min_samples) or 1.0

    def run_s(self, team: str, declared_s: float) -> float:
        """Predicted run time of a job that has not started."""
        return self.remaining_s(team, declared_s, 0.0)

    def remaining_s(self, team: str, declared_s: float, elapsed_s: float) -> float:
        """Predicted run time left of work running for `elapsed_s` (never below a second)."""
        declared = max(1.0, declared_s)
        elapsed = max(0.0, elapsed_s)
        floor = elapsed / declared
        for k in _keys(team, declared):
            ratios = self.groups.get(k)
            if not ratios:
                continue
            later = ratios[bisect.bisect_right(ratios, floor):]
            m = _mean(later, self.min_samples)
            if m is not None:
                return max(1.0, m * declared - elapsed)
        return max(1.0, declared - elapsed)


def _mean(values: list[float], least: int) -> float | None:
    if len(values) < least:
        return None
    return math.fsum(values) / len(values)
