"""Logging: one root logger, ``isthmus``, configured once before anything is built, and the
control loop's context (leader epoch, which loop, its cycle number) on every line logged while
a cycle runs.

Every module logs through ``get_logger(__name__)``, a child of ``isthmus`` named for the module
(``isthmus.control.runtime``, ``isthmus.backends.slurm.adapter``), so one level and one handler
govern all of Isthmus. ``configure`` installs that handler; the server and the CLI call it
first, so that errors raised while the configuration, the database and the backends are built
come out formatted like every later line.

The context lives in a ContextVar set by ``control_cycle`` around one pass of a control job
(broker.control.runtime). A filter on the handler copies it onto each record, so lines from the
admission, dispatch and reconcile code, and from the backend adapters they call, read
``... [admission epoch=3 cycle=17] admission cycle: ...``. Worker threads that serve a cycle
(broker.control.gate) run in a copy of the cycle's context and carry it too.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

ROOT = "isthmus"
FORMAT = "%(asctime)s %(levelname)s %(name)s %(control)s%(message)s"


@dataclass(frozen=True, slots=True)
class CycleContext:
    loop: str  # the control job: admission, dispatch, reconcile:<backend>
    epoch: int  # the leader epoch the cycle's writes are fenced with
    cycle: int  # how many passes of this control job this process has started

    def __str__(self) -> str:
        return f"[{self.loop} epoch={self.epoch} cycle={self.cycle}] "


_CURRENT: contextvars.ContextVar[CycleContext | None] = contextvars.ContextVar(
    "isthmus_cycle", default=None
)


def get_logger(module: str) -> logging.Logger:
    """The logger of a module (pass ``__name__``): ``isthmus.<module>``, without the
    ``broker.`` prefix (``broker.control.runtime`` -> ``isthmus.control.runtime``)."""
    return logging.getLogger(f"{ROOT}.{module.removeprefix('broker.')}")


@contextmanager
def control_cycle(loop: str, epoch: int, cycle: int) -> Iterator[CycleContext]:
    """Every line logged inside (in this thread, or in a worker started with a copy of this
    context) carries the loop, the epoch and the cycle number."""
    ctx = CycleContext(loop, epoch, cycle)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


class CycleFilter(logging.Filter):
    """Puts the current cycle's context on the record as ``control`` ("" outside a cycle)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CURRENT.get()
        record.control = str(ctx) if ctx is not None else ""
        return True


def configure(level: int | str = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send the ``isthmus`` logger's lines (and any library's warnings) to ``stream`` (stderr)
    in one format. Idempotent: a second call replaces the handler the first one installed."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(CycleFilter())
    handler.set_name("isthmus")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "isthmus"]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger(ROOT).setLevel(level)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # skipped overlapping runs are normal
    # alembic lists the plugins it sets up on every start (seven INFO lines, even before a
    # refusal); the migrations it runs ("Running upgrade ...") are still told
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # the HTTP client logs every request at INFO (the simulator's progress reports, the
    # Kubernetes and OIDC clients): one line per call tells nothing that changed
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    return handler
