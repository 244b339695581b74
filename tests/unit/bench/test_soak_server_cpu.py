"""The soak counts the private PostgreSQL's CPU (bench/soak.py `Postgres.cpu_s`): the
postmaster's own, the sessions it reaped, and those still running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.soak import Postgres, _sample

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
POSTMASTER = f"""
import subprocess, sys
BUSY = {BUSY!r}
print("ready", flush=True)
sys.stdin.readline()
subprocess.run([sys.executable, "-c", BUSY])  # a session that ended: reaped, in cutime
print("ended", flush=True)
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", BUSY + "time.sleep(60)"])
print("running", flush=True)
sys.stdin.readline()
child.kill()
child.wait()
"""


def _step(postmaster: subprocess.Popen[str], said: str) -> None:
    assert postmaster.stdin is not None and postmaster.stdout is not None
    if said != "ready":
        postmaster.stdin.write("\n")
        postmaster.stdin.flush()
    assert postmaster.stdout.readline().strip() == said


def test_the_servers_cpu_counts_its_sessions_ended_and_running(tmp_path: Path) -> None:
    """A stand-in postmaster that idles while its children work: what it used itself is next
    to nothing, so each step's CPU is its children's."""
    postmaster = subprocess.Popen([sys.executable, "-c", POSTMASTER], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "postmaster.pid").write_text(f"{postmaster.pid}\n{tmp_path}\n")
        pg = Postgres.__new__(Postgres)  # not started: only where its data is
        pg.base = tmp_path
        _step(postmaster, "ready")
        before = pg.cpu_s()
        _step(postmaster, "ended")
        ended = pg.cpu_s()
        assert ended - before >= 0.25, (before, ended)
        _step(postmaster, "running")
        deadline = time.monotonic() + 30
        while pg.cpu_s() - ended < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)  # the running child's CPU, before anything reaped it
        assert pg.cpu_s() - ended >= 0.25, (ended, pg.cpu_s())
        _step(postmaster, "")
    finally:
        postmaster.kill()
        postmaster.wait()


def test_a_server_not_running_counts_nothing_and_the_sample_shows_it_as_pg(
        tmp_path: Path) -> None:
    pg = Postgres.__new__(Postgres)
    pg.base = tmp_path  # no postmaster.pid
    assert pg.cpu_s() == 0.0
    assert _sample([], lambda: 12.4) == {"rss": {}, "cpu": {"pg": 12}}
    assert _sample([]) == {"rss": {}, "cpu": {}}
