"""Clocks of the simulated backend: virtual time for tests and benchmarks, wall time for a
server.

`t` is simulated seconds since the start; `at(t)` is the instant a simulated time is reported
as (facts, releases). The virtual clock moves only when told; the wall clock moves with
`time.time()`, `speed` simulated seconds per wall second, and reports instants in wall time
(the broker compares them with its own clock), so a job of 600 simulated seconds at speed 10
starts and ends 60 wall seconds apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta


class SimClock:
    """Virtual time shared by several simulated backends."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.t = 0.0

    @property
    def now(self) -> datetime:
        return self.at(self.t)

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError("virtual time only moves forward")
        self.t += dt


class WallClock(SimClock):
    """Simulated time driven by wall time: `speed` simulated seconds per wall second."""

    def __init__(self, speed: float = 1.0, wall: Callable[[], float] = time.time) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._wall = wall
        self._t0 = wall()
        super().__init__(datetime.fromtimestamp(self._t0, UTC))

    @property
    def t(self) -> float:
        return (self._wall() - self._t0) * self.speed

    @t.setter
    def t(self, value: float) -> None:
        """Only SimClock.__init__ sets it (to 0): wall time cannot be set."""

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t / self.speed)

    def advance(self, dt: float) -> None:
        raise TypeError("wall time moves by itself; call SimBackend.sync()")
