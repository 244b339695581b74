"""Start-up of the API server: configuration, database, listener checks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from broker import gc_settings, logs
from broker.config import IsthmusConfig, is_loopback, load_config

if TYPE_CHECKING:
    from broker.control.runtime import Runtime
    from broker.store.db import Database
    from broker.store.process_lock import ProcessLock


class ServerError(RuntimeError):
    pass


def run(
    config_path: Path, *, db_url: str | None = None, host: str | None = None,
    port: int | None = None,
    control: bool = True, workers: int = 1, factory: str | None = None,
) -> None:
    """Serve the API, and the control loop when it leads. With `workers` > 1 (PostgreSQL),
    that many worker processes on one socket (broker.server_workers; `factory` names their
    app factory, for the benchmark's variant)."""
    import uvicorn

    logs.configure()  # first: errors while building the backends come out formatted too
    from broker.web import build_app

    config = load_config(config_path)
    host = host or config.server.host
    port = port or config.server.port
    check_config(config, config_path, host)
    if workers != 1:
        _serve_workers(config, config_path, db_url or config.database, host, port, control,
                       workers, factory)
        return
    db, lock = open_database(db_url or config.database)
    runtime = None
    if config.control.enabled and control:
        runtime = build_control(config, db, host, port)
    logs.get_logger(__name__).info(
        "isthmus listening on %s:%d (database %s, auth %s)", host, port, db.dialect,
        config.auth.mode,
    )
    app = build_app(config, db, runtime)
    gc_settings.settle()  # started: what start-up made is not collected again
    if runtime is not None:
        runtime.start()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if runtime is not None:
            runtime.stop()
        if lock is not None:
            lock.release()


def _serve_workers(config: IsthmusConfig, config_path: Path, db_url: str, host: str,
                   port: int, control: bool, workers: int, factory: str | None) -> None:
    """Refused on SQLite; otherwise the database is migrated here, once, and the workers
    open it themselves."""
    from sqlalchemy.engine import make_url

    from broker.server_workers import FACTORY, WorkersRefused, check_workers, serve
    from broker.store.db import DatabaseURLError, normalise_url

    try:
        check_workers(workers, make_url(normalise_url(db_url)).get_backend_name() == "sqlite")
    except (WorkersRefused, DatabaseURLError) as exc:
        raise ServerError(str(exc)) from None
    db, _ = open_database(db_url)
    db.dispose()
    logs.get_logger(__name__).info(
        "isthmus listening on %s:%d with %d workers (database %s, auth %s)", host, port,
        workers, db.dialect, config.auth.mode,
    )
    serve(config_path, db.url, host, port, control, workers, factory or FACTORY)


def check_config(config: IsthmusConfig, config_path: Path, host: str) -> None:
    """Refuse to start on backends that do not check out, an unauthenticated listener that is
    not loopback, or tokens whose env vars are not set."""
    from broker.wiring.runtime import check_backends

    problems = check_backends(config)  # the same check as `isthmus config check`
    if problems:
        raise ServerError("\n".join(f"{config_path}: {line}" for line in problems))
    if config.auth.mode == "none" and not is_loopback(host):
        raise ServerError(
            f"auth.mode is 'none', which is allowed only on a loopback listener; "
            f"--host {host} is not loopback. Listen on 127.0.0.1 or configure tokens."
        )
    if config.auth.mode == "token":
        missing = [t.name for t in config.auth.tokens if t.digest() is None]
        if missing:
            raise ServerError(f"auth.tokens: the env vars of token(s) {missing} are not set")


def open_database(url: str) -> tuple[Database, ProcessLock | None]:
    """The database, migrated, and (SQLite) the lock that keeps a second server off it."""
    from broker.store.db import DatabaseURLError, connect
    from broker.store.migrate import upgrade
    from broker.store.process_lock import DatabaseInUse, ProcessLock

    try:
        db = connect(url)
    except DatabaseURLError as exc:
        raise ServerError(str(exc)) from None
    lock = ProcessLock(url) if db.is_sqlite else None
    if lock is not None:
        try:
            lock.acquire()
        except DatabaseInUse as exc:
            raise ServerError(str(exc)) from None
    upgrade(db)
    return db, lock


def build_control(config: IsthmusConfig, db: Database, host: str, port: int) -> Runtime:
    """The control loop's runtime, told the listener as it really is (flags override the
    file): simulated backends report progress to it."""
    from broker.wiring.runtime import build_runtime

    listening = config.server.model_copy(update={"host": host, "port": port})
    return build_runtime(config.model_copy(update={"server": listening}), db)
