"""The soak's harness measures its own loop's lag (`bench.soak.harness_lag`) and prints the
worst of each minute beside the p99 (`report`): a stall of the harness delays the answers it
times, which the servers did not cause."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.soak import Stats, harness_lag, report


class _Load:
    def __init__(self) -> None:
        self.stats = Stats()

    def minute(self, t: float) -> int:
        return 0


def test_a_stall_of_the_harness_loop_is_measured() -> None:
    load = _Load()

    async def run() -> None:
        task = asyncio.ensure_future(harness_lag(load))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(load.stats.lag[0]) < 3 and time.monotonic() < deadline:  # ticking
            await asyncio.sleep(0.005)
        time.sleep(0.08)  # the harness's loop stalls (what the probe is for)
        while max(load.stats.lag[0], default=0) < 70 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        task.cancel()

    asyncio.run(run())
    assert max(load.stats.lag[0], default=0) >= 70


def test_the_worst_lag_of_each_minute_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    stats = Stats()
    stats.lat[0] = [10.0] * 100
    stats.lag[0] = [0.5, 57.4, 2.0]
    rows = {0: {"rss": {"a": 100.0}, "cycle_p95": None, "leader": None}}
    report(rows, stats, {}, warmup=0)
    out = capsys.readouterr().out
    header, line = out.splitlines()[:2]
    assert header.split("  ")[-2].strip() == "harness lag max ms"
    assert line.split()[-2] == "57"  # then the cycle p95 ("-": none scraped)
