"""The drop-ins in pipes: ``isacct | head -5`` ends as ``sacct | head -5`` does.

Python ignores SIGPIPE and turns a write to a closed pipe into BrokenPipeError, whose
traceback lands on the terminal. Slurm's commands are C programs that keep the default action:
the reader went away, the writer ends at once and silently. Each drop-in restores it first.
"""

from __future__ import annotations

import signal


def end_quietly_on_closed_pipe() -> None:
    if hasattr(signal, "SIGPIPE"):  # POSIX
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
