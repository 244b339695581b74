"""The FastAPI application: wiring, error handlers and health."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from broker import __version__
from broker.api.audit_linker import AuditLinker
from broker.api.audit_trail import AuditTrail, AuditWriter
from broker.api.auth import Authenticator
from broker.api.group_commit import SubmitQueue
from broker.api.guards import plain_query
from broker.api.limits import BodyLimit, BodyTooLarge, problem_413
from broker.api.problems import PROBLEM_JSON, Problem, ProblemBody
from broker.api.routes_admin import router as admin_router
from broker.api.routes_audit import router as audit_router
from broker.api.routes_hpc import router as hpc_router
from broker.api.routes_jobs import router as jobs_router
from broker.api.routes_plan import router as plan_router
from broker.api.routes_progress import router as progress_router
from broker.api.routes_templates import router as templates_router
from broker.api.routes_views import router as views_router
from broker.api.schemas import Health
from broker.api.wakes import admission_waker
from broker.config import IsthmusConfig
from broker.control.runtime import Runtime
from broker.domain.spec import JobSpec
from broker.logs import get_logger
from broker.metrics import REGISTRY, store_collectors
from broker.orchestration import notice_rule
from broker.orchestration.transitions import JobNotFound
from broker.store.db import Database
from broker.store.db_clock import db_now

log = get_logger(__name__)


def create_app(config: IsthmusConfig, db: Database, runtime: Runtime | None = None) -> FastAPI:
    app = FastAPI(
        title="Isthmus",
        version=__version__,
        description="One job lifecycle and one quota ledger for GPU gangs on Slurm and Kubernetes",
    )
    app.state.config = config
    app.state.db = db
    app.state.period_clock = db_now  # what budget periods roll over by (tests inject one)
    # this process's transitions write notices for the teams that have them (notice_rule)
    notice_rule.watch_teams(t.name for t in config.teams if t.notices is not None)
    app.state.authenticator = Authenticator(config)
    app.state.wake_admission = waker = admission_waker(db, runtime)
    if waker is not None:
        app.router.on_shutdown.append(waker.stop)
    app.state.audit_linker = linker = AuditLinker(db)
    app.router.on_startup.append(linker.start)  # sweeps what a process that died left staged
    app.state.submit_queue = SubmitQueue(db, config, on_commit=waker, on_staged=linker.poke)
    app.state.runtime = runtime
    app.add_middleware(BodyLimit, max_bytes=config.server.max_body_bytes)
    app.state.audit_writer = audit = AuditWriter(db, on_staged=linker.poke)
    app.router.on_shutdown.append(audit.close)
    app.router.on_shutdown.append(linker.close)  # after the writer: links its last records
    # outside BodyLimit: a refused body's 413 is recorded too
    app.add_middleware(AuditTrail, writer=audit)
    for router in ROUTERS:
        app.include_router(router, dependencies=[Depends(plain_query)])
    _add_error_handlers(app, config)
    _add_meta_routes(app, config, db, runtime)
    app.openapi = lambda: _openapi(app, config)  # type: ignore[method-assign]
    return app


ROUTERS = (jobs_router, plan_router, progress_router, admin_router, hpc_router, views_router,
           templates_router, audit_router)


def _add_error_handlers(app: FastAPI, config: IsthmusConfig) -> None:
    """Every error as an RFC 9457 problem: ours, too large bodies, unknown jobs, invalid
    requests (each field named), HTTP errors (405 with every allowed method), the rest 500."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> Response:
        body = problem_413(config.server.max_body_bytes)
        return Response(body, status_code=413, media_type=PROBLEM_JSON)

    @app.exception_handler(JobNotFound)
    async def _not_found(request: Request, exc: JobNotFound) -> JSONResponse:
        return Problem(404, "job-not-found", "Job not found", str(exc)).response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": _field(e["loc"]), "message": e["msg"].removeprefix("Value error, ")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return Problem(422, "invalid-request", "Invalid request", detail, errors).response(
            request.url.path
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            routes = [*app.router.routes, *(r for rt in ROUTERS for r in rt.routes)]
            headers["Allow"] = _allowed_methods(routes, request.url.path)
        return Problem(
            exc.status_code, slug, str(exc.detail), str(exc.detail), headers=headers or None
        ).response(request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return Problem(
            500, "internal-error", "Internal error",
            "the server failed; the request was not applied and can be retried",
        ).response(request.url.path)


def _add_meta_routes(app: FastAPI, config: IsthmusConfig, db: Database,
                     runtime: Runtime | None) -> None:
    """/metrics (the process's and the store's) and /healthz."""
    registry = CollectorRegistry()
    for collector in store_collectors(db, config):
        registry.register(collector)

    @app.get("/metrics", tags=["meta"], include_in_schema=False)
    def metrics(request: Request) -> Response:
        if config.server.metrics_auth:
            app.state.authenticator.authenticate(request.headers.get("authorization"))
        body = generate_latest(REGISTRY) + generate_latest(registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=Health, tags=["meta"])
    def healthz() -> Health:
        with db.read() as s:
            s.execute(text("SELECT 1"))
        if runtime is None:
            control, epoch = "off", None
        else:
            control = "leader" if runtime.leading else "standby"
            epoch = runtime.lease.epoch if runtime.leading else None
        return Health(
            status="ok", database=db.dialect, version=__version__, control=control, epoch=epoch
        )


def _openapi(app: FastAPI, config: IsthmusConfig) -> dict[str, Any]:
    """The OpenAPI document, built once: the routes, the JobSpec and Problem schemas, and the
    security scheme."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(
            title=app.title, version=app.version, description=app.description,
            routes=app.routes,
        )
        components = schema.setdefault("components", {})
        comps = components.setdefault("schemas", {})
        spec_schema = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(spec_schema.pop("$defs", {}))
        comps["JobSpec"] = spec_schema
        problem = ProblemBody.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(problem.pop("$defs", {}))
        comps["Problem"] = problem
        _document_security(schema, open_mode=config.auth.mode == "none")
        app.openapi_schema = schema
    return app.openapi_schema


def _document_security(schema: dict[str, Any], open_mode: bool) -> None:
    """Bearer tokens on every /v1 route (progress reports use their per-attempt token);
    health and metrics are open. With `auth.mode: none` the token is optional."""
    schema["components"]["securitySchemes"] = {
        "bearerAuth": {
            "type": "http", "scheme": "bearer",
            "description": "an API token (`ISTHMUS_TOKEN`), or the per-attempt progress token "
            "(`ISTHMUS_PROGRESS_TOKEN`) for POST /v1/jobs/{id}/progress",
        }
    }
    schema["security"] = [{"bearerAuth": []}, {}] if open_mode else [{"bearerAuth": []}]
    for path, item in schema.get("paths", {}).items():
        if not path.startswith("/v1/"):
            for operation in item.values():
                operation["security"] = []


def _field(loc: tuple[int | str, ...]) -> str:
    """'gang.replicas' from ('body', 'gang', 'replicas'); the request part is implied."""
    parts = loc[1:] if loc and loc[0] in ("query", "path", "header", "body") else loc
    return ".".join(str(p) for p in parts) or "(body)"


def _allowed_methods(routes: list[BaseRoute], path: str) -> str:
    """Every method some route serves at this path. Starlette's own Allow names only the first
    route that matched the path, and GET and POST /v1/jobs are two routes."""
    methods: set[str] = set()
    for route in routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(path):
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))
