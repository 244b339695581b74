"""Node-event times from sacctmgr: local time of the sacctmgr process unless told otherwise.

A time read in the wrong zone moves an event by hours, into or out of a job's run (see
classify.event_in_run). The CLI transport runs sacctmgr with TZ=UTC and SLURM_TIME_FORMAT=%s,
so it reads epoch seconds; the parser also takes ISO times, with an offset or in a given zone.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from backends.slurm import parse
from backends.slurm.transport_cli import CliTransport

NEW_YORK = ZoneInfo("America/New_York")
AT_5 = datetime(2026, 12, 1, 3, 42, 5, tzinfo=UTC)
AT_7 = datetime(2026, 12, 1, 3, 42, 7, tzinfo=UTC)


@pytest.mark.parametrize(("case", "text", "tz", "start", "end"), [
    ("epoch seconds (what the CLI transport asks for)", "1796096525|1796096527", None,
     AT_5, AT_7),
    ("local time of a sacctmgr run in New York", "2026-11-30T22:42:05|2026-11-30T22:42:07",
     NEW_YORK, AT_5, AT_7),
    ("local time of a sacctmgr run in UTC", "2026-12-01T03:42:05|Unknown", UTC, AT_5, None),
    ("an offset wins over the zone", "2026-11-30T22:42:05-05:00|", UTC, AT_5, None),
    ("epoch 0 and None are no time", "0|None", None, None, None),
])
def test_sacctmgr_event_times(case: str, text: str, tz: tzinfo | None, start: datetime | None,
                              end: datetime | None) -> None:
    (ev,) = parse.sacctmgr_events(f"a100-2|{text}|DOWN*|Not responding\n", tz=tz)
    assert (ev.start, ev.end) == (start, end), case
    assert (ev.node, ev.state, ev.flags) == ("a100-2", "down", frozenset({"NOT_RESPONDING"}))


def test_naive_times_default_to_this_process_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        (ev,) = parse.sacctmgr_events("a100-2|2026-11-30T22:42:05|Unknown|DOWN|x\n")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert ev.start == AT_5 and ev.end is None


def test_cli_asks_sacctmgr_for_epoch_times_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever zone the broker or its configured Slurm env is in, the query's start is sent in
    UTC to a sacctmgr running in UTC, and its answer is read as epoch seconds."""
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append((argv, kw["env"]))
        return subprocess.CompletedProcess(argv, 0, "a100-1|1796096525|1796096527|DOWN|x\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    cli = CliTransport(slurm_conf=None, timeout=5, env={"TZ": "America/New_York"})
    since = datetime(2026, 11, 30, 22, 41, tzinfo=NEW_YORK)
    (ev,) = cli.node_events(["a100-1"], since=since)
    argv, env = calls[0]
    assert "Start=2026-12-01T03:41:00" in argv
    assert (env["TZ"], env["SLURM_TIME_FORMAT"]) == ("UTC", "%s")
    assert cli.env["TZ"] == "America/New_York"  # other commands keep the configured zone
    assert (ev.start, ev.end) == (AT_5, AT_7)
