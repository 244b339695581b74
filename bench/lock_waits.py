"""Lock waits in a PostgreSQL log, by who waited, who held the lock and the waiting statement.

For a server run with `log_lock_waits=on` (each wait longer than `deadlock_timeout` logged
when it starts and when the lock is acquired) and
`log_line_prefix='%m_[%p]_%a_'` (bench/soak.py's `SOAK_PGOPTS` shows the whole set). A
session's name is its `application_name` (the soak names its processes a, b, c, d); a holder
that never waited itself is named from its `connection authorized` line when
`log_connections=on`, else by its process id. Prints one line per (waiter, holder, statement),
the most frequent first: count, median and longest wait in ms.

    python -m bench.lock_waits /tmp/pglog/*.log
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from pathlib import Path

_LINE = re.compile(r"\S+ \S+ \S+_\[(\d+)\]_([^_]*)_(\w+):\s+(.*)")


def waits(lines: list[str]) -> dict[tuple[str, str, str], list[float]]:
    """(waiter, holder, statement) -> the waits' lengths in ms."""
    names: dict[str, str] = {}
    pending: dict[str, tuple[str, str]] = {}  # waiter pid -> (holder pid, statement)
    acquired: list[tuple[str, str, str, float]] = []
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if not m:
            continue
        pid, app, kind, msg = m.groups()
        if app and app != "[unknown]":
            names[pid] = app
        if (named := re.search(r"connection authorized: .*application_name=(\S+)", msg)):
            names[pid] = named.group(1)
        if kind == "LOG" and "still waiting" in msg:
            detail = "\n".join(lines[i + 1:i + 5])
            holder = re.search(r"Process holding the lock: (\d+)", detail)
            statement = re.search(r"_STATEMENT:\s+(.*)", detail)
            pending[pid] = (holder.group(1) if holder else "?",
                            statement.group(1)[:70] if statement else "?")
        elif kind == "LOG" and "acquired" in msg and pid in pending:
            after = re.search(r"after ([\d.]+) ms", msg)
            held_by, waiting = pending.pop(pid)
            acquired.append((pid, held_by, waiting, float(after.group(1)) if after else 0.0))
    out: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for pid, held_by, waiting, ms in acquired:
        out[(names.get(pid, pid), names.get(held_by, held_by), waiting)].append(ms)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    lines = [line for log in args.logs
             for line in log.read_text(errors="replace").splitlines()]
    found = sorted(waits(lines).items(), key=lambda kv: -len(kv[1]))
    for (waiter, holder, statement), ms in found[:args.top]:
        print(f"{len(ms):6d}  p50 {statistics.median(ms):6.0f}  max {max(ms):6.0f}  "
              f"{waiter} waited for {holder}: {statement}")


if __name__ == "__main__":
    main()
