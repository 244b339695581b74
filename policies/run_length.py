"""Run-time prediction from history, for the queue estimate (policies/eta.py).

Declared limits (`max_runtime`) are over-estimates rounded up to a few familiar values, and
most jobs use a small, varying part of theirs (Tsafrir et al. 2007, "Backfilling using
system-generated predictions rather than user runtime estimates"). What a job will really run
is better told by what similar jobs ran here: this model keeps, per group of ended attempts,
the ratios of true to declared run time, and predicts a job's run as its declared limit times
the mean ratio of the most specific group that has enough samples (the mean, not the median:
a start waits for the sum of the runs ahead of it, and run times are skewed; measured with
bench/eta_accuracy.py, 2026-12-01, in docs/benchmarks/history/2026-11-29..12-05.md):

  1 the same team, the same declared limit and the same number of GPUs
  2 the same declared limit and the same number of GPUs (bigger gangs run longer)
  3 the same declared limit (users pick a few round values; the value says much of the run)
  4 every sample

(Measured on bench/eta_accuracy.py, seeds 3, 5, 7: these groups gave a median error of
60/53/52% where team-and-limit, limit, team groups gave 61/56/55%; 2026-12-01 session 4 in
docs/benchmarks/history/2026-11-29..12-05.md.)

The spread of the same ratios gives the uncertainty: `run_s(..., q)` is the q-quantile of the
group's ratios times the limit instead of the mean (policies/eta.py projects the queue at a low
and a high quantile for the window of a start).

A job with no group of `min_samples` (and a model with fewer samples than that) keeps its
declared limit. Work already running for `elapsed` seconds is predicted from the samples of
its group that ran longer than that (a job 5 h into an 8 h limit is not a typical job of the
group any more); when none did, it is expected at its declared end.

Pure: samples in, predictions out.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MIN_SAMPLES = 8
"""A group with fewer samples than this does not speak; the next coarser one does."""


@dataclass(frozen=True, slots=True)
class RunSample:
    """One ended attempt: who ran it, what it declared, what it ran (seconds)."""

    team: str
    declared_s: float
    ran_s: float
    gpus: int = 0
    """GPUs of the whole gang (0: not known)."""


_Key = tuple[str, ...]


@functools.lru_cache(maxsize=4096)  # pure; a few hundred running jobs ask it every cycle
def _keys(team: str, declared_s: float, gpus: int) -> tuple[_Key, ...]:
    d, g = str(round(declared_s)), str(max(0, gpus))
    return (("t", team, "d", d, "g", g), ("d", d, "g", g), ("d", d), ())


@dataclass(frozen=True, slots=True)
class Ratios:
    """Run/declared ratios (one per quantile asked) of work that has run a share of its
    declared limit within [low, high): the same for any elapsed time in that range."""

    ratios: tuple[float, ...]
    low: float
    high: float

    def covers(self, declared_s: float, elapsed_s: float) -> bool:
        return self.low <= max(0.0, elapsed_s) / max(1.0, declared_s) < self.high

    def remaining(self, declared_s: float, elapsed_s: float) -> tuple[float, ...]:
        """Run time left at each ratio (never below a second)."""
        declared, elapsed = max(1.0, declared_s), max(0.0, elapsed_s)
        return tuple(max(1.0, m * declared - elapsed) for m in self.ratios)


@dataclass(frozen=True, slots=True)
class RuntimeModel:
    """Sorted true/declared ratios per group (see the module doc)."""

    groups: dict[_Key, list[float]] = field(default_factory=dict)
    min_samples: int = MIN_SAMPLES
    _sums: dict[_Key, list[float]] = field(default_factory=dict, compare=False, repr=False)
    """Per group, the running sums of its sorted ratios (filled on first use): the mean of the
    samples above a floor in O(log n), where a slice and a sum cost O(n) per running job and
    cycle (bench/loop_cost.py)."""

    @classmethod
    def learn(cls, samples: Iterable[RunSample], min_samples: int = MIN_SAMPLES) -> RuntimeModel:
        groups: dict[_Key, list[float]] = {}
        for s in samples:
            if s.declared_s <= 0 or s.ran_s < 0:
                continue  # bounded before use: a sample that cannot be a ratio is left out
            ratio = min(1.0, s.ran_s / s.declared_s)
            for k in _keys(s.team, s.declared_s, s.gpus):
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

    def run_s(self, team: str, declared_s: float, gpus: int = 0,
              q: float | None = None) -> float:
        """Predicted run time of a job of `gpus` GPUs that has not started: the mean, or with
        `q` the q-quantile (0..1) of its group."""
        return self.remaining_s(team, declared_s, 0.0, gpus, q)

    def remaining_s(self, team: str, declared_s: float, elapsed_s: float,
                    gpus: int = 0, q: float | None = None) -> float:
        """Predicted run time left of work running for `elapsed_s` (never below a second): the
        mean, or with `q` the q-quantile, of the group's samples that ran longer."""
        return self.remaining_at(team, declared_s, elapsed_s, gpus, (q,))[0]

    def remaining_at(self, team: str, declared_s: float, elapsed_s: float, gpus: int,
                     qs: Sequence[float | None]) -> tuple[float, ...]:
        """`remaining_s` at each of `qs` (None: the mean), the group looked up once."""
        return self.ratios_at(team, declared_s, elapsed_s, gpus, qs).remaining(
            declared_s, elapsed_s)

    def ratios_at(self, team: str, declared_s: float, elapsed_s: float, gpus: int,
                  qs: Sequence[float | None]) -> Ratios:
        """The run/declared ratios `remaining_at` predicts from, with the share of its limit
        the work may run on for which they stay the same (the same samples ran longer): every
        running attempt is predicted each cycle, and looks its group up again only then."""
        declared = max(1.0, declared_s)
        floor = max(0.0, elapsed_s) / declared
        low, high = -math.inf, math.inf
        for k in _keys(team, declared, gpus):
            ratios = self.groups.get(k)
            if not ratios:
                continue
            start = bisect.bisect_right(ratios, floor)
            # the same `start` for any share in [ratios[start - 1], ratios[start])
            if start > 0:
                low = max(low, ratios[start - 1])
            if start < len(ratios):
                high = min(high, ratios[start])
            if len(ratios) - start < max(1, self.min_samples):
                continue  # too few ran longer: the next coarser group speaks (as for any q)
            return Ratios(tuple(self._mean_from(k, ratios, start) if q is None else
                                _quantile(ratios, start, q) for q in qs), low, high)
        return Ratios((1.0,) * len(qs), low, high)  # no group speaks: the declared end

    def _mean_from(self, key: _Key, ratios: list[float], start: int) -> float:
        """The mean of ``ratios[start:]`` (not empty: the caller checked min_samples)."""
        sums = self._sums.get(key)
        if sums is None:
            sums = self._sums[key] = [0.0, *itertools.accumulate(ratios)]
        return round((sums[-1] - sums[start]) / (len(ratios) - start), 12)  # the sums' rounding


def _mean(values: list[float], least: int) -> float | None:
    if len(values) < least:
        return None
    return math.fsum(values) / len(values)


def _quantile(values: list[float], start: int, q: float) -> float:
    """The q-quantile of sorted ``values[start:]`` (not empty), interpolated between
    neighbours; indexed in place, not sliced."""
    n = len(values) - start
    pos = min(1.0, max(0.0, q)) * (n - 1)
    i = math.floor(pos)
    j = min(i + 1, n - 1)
    return values[start + i] + (values[start + j] - values[start + i]) * (pos - i)
