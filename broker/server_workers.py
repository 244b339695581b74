"""`isthmus server --workers N`: N API worker processes on one listening socket (PostgreSQL).

uvicorn's process supervisor binds the socket once and starts N worker processes that accept
on it (the kernel hands each new connection to one of them).
A worker is a fresh interpreter (spawned, not forked: no database connection or thread is
inherited), so what it needs crosses in one environment variable, read by `worker_app`.

Every worker is a replica of its own: with the control loop on, each builds the runtime and
runs the lease keeper, and the leader lease (broker.control.lease) elects exactly one of them
to run the admission, dispatch and reconcile jobs, as it does among replicas on several
machines (whose hand-over when the leader dies tests/e2e/test_replicas.py shows), with no
special case for workers. The others only answer the API (their /healthz says `standby`);
a submission they commit wakes the leader's admission through PostgreSQL NOTIFY
(broker.store.notify), as one committed by another replica does.

SQLite is refused (`check_workers`): it allows one writer, and the server holds a lock on
the database file so that a second process never opens it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import gc_settings, logs
from broker.config import load_config

if TYPE_CHECKING:
    from fastapi import FastAPI

ENV = "ISTHMUS_SERVER_WORKER"
FACTORY = "broker.server_workers:worker_app"


class WorkersRefused(RuntimeError):
    pass


def check_workers(workers: int, is_sqlite: bool) -> None:
    if workers < 1:
        raise WorkersRefused(f"--workers {workers}: give at least 1")
    if workers > 1 and is_sqlite:
        raise WorkersRefused(
            f"--workers {workers} needs PostgreSQL: SQLite allows one writer and one server "
            "process per database file. Drop --workers (or give --workers 1), or point "
            "--db at a postgresql:// database."
        )


def serve(config_path: Path, db_url: str, host: str, port: int, control: bool,
          workers: int, factory: str = FACTORY) -> None:
    """Run `workers` worker processes under uvicorn's supervisor until it is stopped."""
    import uvicorn

    os.environ[ENV] = json.dumps({"config": str(config_path.resolve()), "db": db_url,
                                  "host": host, "port": port, "control": control})
    uvicorn.run(factory, factory=True, host=host, port=port, workers=workers,
                log_level="warning")


def worker_app() -> FastAPI:
    """The app of one worker (uvicorn calls this in each worker process): the database (the
    parent migrated it), and the runtime when the control loop is on, started with the app
    and stopped when the worker stops."""
    from broker.store.db import connect
    from broker.web import build_app
    from broker.wiring.runtime import build_runtime

    logs.configure()
    args: dict[str, Any] = json.loads(os.environ[ENV])
    config = load_config(Path(args["config"]))
    db = connect(args["db"])
    runtime = None
    if config.control.enabled and args["control"]:
        # told the listener as it really is, as broker.server.build_control does
        listening = config.server.model_copy(update={"host": args["host"],
                                                     "port": args["port"]})
        runtime = build_runtime(config.model_copy(update={"server": listening}), db)
    app = build_app(config, db, runtime)

    @contextlib.asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[None]:
        if runtime is not None:
            runtime.start()
        app.state.audit_linker.start()
        try:
            yield
        finally:
            if runtime is not None:
                runtime.stop()
            if app.state.wake_admission is not None:
                app.state.wake_admission.stop()
            # this lifespan replaces the app's startup and shutdown handlers (broker.api.app)
            app.state.audit_writer.close()
            app.state.audit_linker.close()  # the records this worker staged, linked
            db.dispose()

    app.router.lifespan_context = lifespan
    gc_settings.settle()  # this worker has started: what it made is not collected again
    return app
