"""Every dependency of the API's routes runs on the event loop: FastAPI runs a sync (`def`)
dependency in a worker thread, a hop per request (each progress report paid one for its bearer
token, each job read, explain and cancel one for its job reference). A dependency that needs
the database hands that part to a worker itself (broker/api/job_refs.py)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from broker.api.app import ROUTERS, create_app
from broker.config import load_config
from broker.store import open_database

ROOT = Path(__file__).resolve().parents[2]


def _calls(dependant: Dependant) -> Iterator[object]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def test_no_route_depends_on_a_sync_function(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path}/deps.db")
    try:
        app = create_app(load_config(ROOT / "examples" / "isthmus.yaml"), db)
    finally:
        db.dispose()
    # the app's own routes and those of the routers it includes (with their dependencies)
    routes = [r for r in [*app.routes, *(r for rt in ROUTERS for r in rt.routes)]
              if isinstance(r, APIRoute)]
    sync = sorted({f"{r.path}: {getattr(call, '__qualname__', call)}"
                   for r in routes for call in _calls(r.dependant)
                   if call is not None and not inspect.iscoroutinefunction(call)})
    assert sync == []
    # the routes that take a job reference or a progress token are among those checked
    paths = {r.path for r in routes}
    assert {"/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
            "/v1/jobs/{job_id}/progress"} <= paths
