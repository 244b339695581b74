"""The soak's monitor (bench/soak.py `Scrapes`) reads each process's /metrics once before the
load: the first minute's admission cycle p95 counts from there, and its client's first request,
which imports what it needs (anyio's event: 30-60 ms of the harness's loop, charged to the
requests it was timing in minute 2 of every run), is made before any request is timed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import soak

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import asyncio, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.soak import Scrapes

    CYCLES = [(0.1, 100), (0.5, 100), ("+Inf", 100)]  # 100 cycles, all under 0.1 s

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = "".join(f'isthmus_admission_cycle_seconds_bucket{{le="{le}"}} {n}\\n'
                           for le, n in CYCLES).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    class Process:
        name = "a"
        url = f"http://127.0.0.1:{server.server_address[1]}"

    async def main():
        scrapes = Scrapes([Process()])
        if sys.argv[1] == "start":
            await scrapes.start()
        loaded = set(sys.modules)
        CYCLES[:] = [(0.1, 100), (0.5, 102), ("+Inf", 102)]  # then 2 more, of 0.1-0.5 s
        p95 = await scrapes.cycle_p95()
        await scrapes.close()
        print(p95, sorted(set(sys.modules) - loaded))

    asyncio.run(main())
""")


def _run(mode: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, text=True,
                         capture_output=True, check=True, timeout=60).stdout.split(" ", 1)
    return out[0], out[1].strip()


def test_the_scrape_during_the_load_imports_nothing_and_counts_from_the_start() -> None:
    p95, imported = _run("start")
    assert imported == "[]", f"the first scrape of the load imported {imported}"
    assert p95 == "0.5"  # the 2 cycles since the start, not the 102 of the whole process


def test_without_the_start_the_first_scrape_imports_and_counts_everything() -> None:
    """What `start` prevents, shown on the same stand-in (the probe works)."""
    p95, imported = _run("none")
    assert imported != "[]"
    assert p95 == "0.1"  # the process's cycles since it started


def test_the_run_reads_the_metrics_before_the_load_and_closes_its_client_whatever_happens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`_run` starts its Scrapes before the load is made (and so before any request is timed),
    and closes its client also when the run fails."""
    order: list[str] = []

    class Recorder:
        def __init__(self, processes: object) -> None:
            order.append("scrapes")

        async def start(self) -> None:
            order.append("start")

        async def close(self) -> None:
            order.append("close")

    class Failed(Exception):
        pass

    def load(*args: object) -> None:
        order.append("load")
        raise Failed

    monkeypatch.setattr(soak, "Scrapes", Recorder)
    monkeypatch.setattr(soak, "Load", load)
    args = soak.parse_args(["--minutes", "1", "--no-drills"])
    with pytest.raises(Failed):
        asyncio.run(soak._run([], args, soak.FileOutage(Path("/nonexistent")), "db"))
    assert order == ["scrapes", "start", "load", "close"]
