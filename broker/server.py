"""Start-up of the API server: configuration, database, listener checks."""

from __future__ import annotations

from pathlib import Path

from broker import logs
from broker.config import is_loopback, load_config


class ServerError(RuntimeError):
    pass


def run(
    config_path: Path, *, db_url: str | None = None, host: str | None = None,
    port: int | None = None,
    control: bool = True,
) -> None:
    import uvicorn

    logs.configure()  # first: errors while building the backends come out formatted too
    from broker.api.app import create_app
    from broker.store.db import DatabaseURLError, open_database

    config = load_config(config_path)
    from broker.control.wiring import check_backends

    problems = check_backends(config)  # the same check as `isthmus config check`
    if problems:
        raise ServerError("\n".join(f"{config_path}: {line}" for line in problems))
    host = host or config.server.host
    port = port or config.server.port
    if config.auth.mode == "none" and not is_loopback(host):
        raise ServerError(
            f"auth.mode is 'none', which is allowed only on a loopback listener; "
            f"--host {host} is not loopback. Listen on 127.0.0.1 or configure tokens."
        )
    if config.auth.mode == "token":
        missing = [t.name for t in config.auth.tokens if t.digest() is None]
        if missing:
            raise ServerError(f"auth.tokens: the env vars of token(s) {missing} are not set")
    from broker.store.process_lock import DatabaseInUse, ProcessLock

    url = db_url or config.database
    try:
        db = open_database(url, migrate=False)
    except DatabaseURLError as exc:
        raise ServerError(str(exc)) from None
    lock = ProcessLock(url) if db.is_sqlite else None
    if lock is not None:
        try:
            lock.acquire()
        except DatabaseInUse as exc:
            raise ServerError(str(exc)) from None
    from broker.store.migrate import upgrade

    upgrade(db)
    runtime = None
    if config.control.enabled and control:
        from broker.control.wiring import build_runtime

        # the listener as it really is (flags override the file): simulated backends report
        # progress to it
        listening = config.server.model_copy(update={"host": host, "port": port})
        runtime = build_runtime(config.model_copy(update={"server": listening}), db)
    logs.get_logger(__name__).info(
        "isthmus listening on %s:%d (database %s, auth %s)", host, port, db.dialect,
        config.auth.mode,
    )
    if runtime is not None:
        runtime.start()
    try:
        uvicorn.run(create_app(config, db, runtime), host=host, port=port, log_level="warning")
    finally:
        if runtime is not None:
            runtime.stop()
        if lock is not None:
            lock.release()
