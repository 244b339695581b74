"""`isthmus control`: the control loop without the API, as a replica of its own (PostgreSQL).

A server that leads runs the admission, dispatch and reconcile passes in the process that
answers the API, so every pass's CPU delays the requests it serves (under bench/soak.py the
leader's API p99 was about twice the standby's). A deployment that wants the two apart runs
its API replicas with `isthmus server --no-control` and one or more of these: each takes the
leader lease when it is free (exactly one leads; another takes over within the lease TTL when
it dies, as between servers), and a submit answered by any API replica wakes the leading
one's admission through PostgreSQL NOTIFY (broker.store.notify).

SQLite is refused: the server holds a lock on the database file so that no second process
opens it, so there would be no API to submit to. The listener address in the configuration
(or --api-host/--api-port) is where the API replicas are reached: simulated backends send
their jobs' progress reports there.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

from broker import gc_settings, logs
from broker.server import ServerError, build_control, check_config, open_database


class ControlRefused(ServerError):
    pass


def _is_sqlite(url: str) -> bool:
    from sqlalchemy.engine import make_url

    from broker.store.db import DatabaseURLError, normalise_url

    try:
        return make_url(normalise_url(url)).get_backend_name() == "sqlite"
    except DatabaseURLError as exc:
        raise ServerError(str(exc)) from None


def run_control(config_path: Path, *, db_url: str | None = None, api_host: str | None = None,
                api_port: int | None = None, metrics: tuple[str, int] | None = None,
                stop: threading.Event | None = None) -> None:
    """Run the control loop (leading or standing by) until SIGTERM or SIGINT (or `stop`);
    with `metrics` (host, port), serve this process's metrics (the control loop's cycles,
    transitions, backend calls) at http://host:port/metrics."""
    from broker.config import is_loopback, load_config

    logs.configure()
    config = load_config(config_path)
    host = api_host or config.server.host
    port = api_port or config.server.port
    if not config.control.enabled:
        raise ControlRefused(f"{config_path}: control.enabled is false; set it to true to run "
                             "the control loop")
    check_config(config, config_path, host)
    url = db_url or config.database
    if _is_sqlite(url):
        raise ControlRefused(
            "isthmus control needs PostgreSQL: on SQLite the server is the one process on the "
            "database file. Run `isthmus server` (it runs the control loop when it leads), or "
            "point --db at a postgresql:// database.")
    if metrics is not None and config.server.metrics_auth and not is_loopback(metrics[0]):
        raise ControlRefused(
            f"--metrics-host {metrics[0]}: server.metrics_auth is on and this listener has no "
            "authentication; serve the metrics on a loopback address (127.0.0.1) or turn "
            "metrics_auth off")
    db, _ = open_database(url)
    runtime = build_control(config, db, host, port)
    done = stop or threading.Event()
    if stop is None:
        def _stop(signum: int, frame: FrameType | None) -> None:
            done.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    log = logs.get_logger(__name__)
    log.info("isthmus control loop started (database %s, API at %s:%d); it leads when it "
             "holds the lease", db.dialect, host, port)
    if metrics is not None:
        from prometheus_client import start_http_server

        from broker.metrics import REGISTRY

        start_http_server(metrics[1], metrics[0], registry=REGISTRY)
        log.info("metrics on http://%s:%d/metrics", *metrics)
    gc_settings.settle()  # started: what start-up made is not collected again
    runtime.start()
    try:
        done.wait()
    finally:
        log.info("isthmus control loop stopping")
        runtime.stop()
        db.dispose()
