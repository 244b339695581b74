"""iscancel --signal on Slurm: a signal to a running job's steps, as ``scancel --signal``."""

from __future__ import annotations

from backends.base import Unsupported
from backends.slurm.transport import Transport

SIGNALS = frozenset({"HUP", "INT", "QUIT", "ABRT", "KILL", "USR1", "USR2", "TERM", "ALRM",
                     "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM",
                     "PROF", "WINCH"})
"""Signals iscancel --signal may send, by name (as scancel takes them, without SIG)."""


def send_signal(transport: Transport, name: str, signal: str, whom: str = "steps") -> str:
    """``scancel --signal=SIGNAL`` for the running job of this name: its steps get it (the
    script's own srun ranks), as scancel sends it; with ``whom`` batch (``scancel -b``) the
    batch shell, with full (``-f``) both. Unsupported when none runs."""
    if signal not in SIGNALS:
        raise Unsupported(f"signal {signal!r}: one of {', '.join(sorted(SIGNALS))}")
    running = [r for r in transport.find(name) if r.state == "RUNNING"]
    if not running:
        raise Unsupported(f"no running Slurm job named {name}")
    if whom == "batch" and transport.kind == "rest":
        raise Unsupported("slurmrestd signals the whole job, steps included; use scancel -f "
                          "(--full), or transport 'cli' for the batch shell alone")
    send, to = {"steps": (transport.signal_steps, "the steps of"),
                "batch": (transport.signal, "the batch shell of"),
                "full": (transport.signal_full, "the batch shell and steps of")}[whom]
    sent = [r.job_id for r in running if send(r.job_id, signal)]
    if not sent:
        raise Unsupported(f"Slurm did not signal {name}: it ended meanwhile")
    return f"SIG{signal} sent to {to} Slurm job {', '.join(sent)}"
