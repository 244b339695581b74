"""The API's audit trail: every state-changing call, and every read of another team's data by
an admin, recorded in the audit log (broker/store/audit_log.py) before its answer is sent.

One ASGI middleware (`AuditTrail`) sees every request: it gives it a request id (the client's
`X-Request-ID` when it is a plain token, else a fresh one; echoed on every answer) and a
`Note` that the request's code fills as it learns things: who the caller is (the
authenticator), the target a route resolved (a job's id for its number), a cross-team read
(`read_of`). When the answer's status is known, the middleware turns the request into an
`Entry` (action, route template, target, outcome, status) and hands it to the `AuditWriter`,
which group-commits the entries of concurrent requests in one transaction; the answer waits
for that commit, so an answered call has its record (staged, then linked to the hash chain
within moments: broker/api/audit_linker.py). A submit's record is written in the
submit's own group commit instead (`InCommit`, broker/api/group_commit.py): the hot path
pays no transaction of its own. A crash between a call's commit and its record's loses that
record; the submit path has no such window.

Not recorded: GETs other than an admin's reads of other teams' jobs, of every team's job list
or report, and of /v1/admin; POST /v1/plan (stores nothing); a job's own progress reports
(its attempt's token, not a person); requests that matched no route or method.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import re
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from broker.logs import get_logger
from broker.metrics import AUDIT_FAILED
from broker.store import audit_log
from broker.store.audit_log import ALLOWED, REFUSED, Entry
from broker.store.conflicts import on_conflict
from broker.store.db import Database

log = get_logger(__name__)

REQUEST_ID = "X-Request-ID"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
UNAUTHENTICATED = "(unauthenticated)"
ALL_TEAMS = "all-teams"

# Every state-changing route's action, by its endpoint (module.function); a route missing
# here is recorded as "<method> <route>" (tests/integration/test_audit_log.py holds this
# table to the routes).
ACTIONS = {
    "routes_jobs.submit": "job.submit",
    "routes_templates.submit_from_template": "job.submit-template",
    "routes_hpc.batch": "job.submit-batch",
    "routes_jobs.cancel": "job.cancel",
    "routes_jobs.hold": "job.hold",
    "routes_jobs.release": "job.release",
    "routes_jobs.requeue": "job.requeue",
    "routes_hpc.signal": "job.signal",
    "routes_admin.approve": "job.approve",
    "routes_admin.refuse": "job.refuse",
    "routes_admin.drain": "pool.drain",
    "routes_admin.undrain": "pool.undrain",
    "routes_admin.retry_notice": "notice.retry",
    # the dashboard's forms that change something (the one job form and the session)
    "pages_submit.submit": "job.submit-template",
    "pages.signin": "ui.signin",
    "pages.signout": "ui.signout",
}
NOT_RECORDED = {
    "routes_plan.plan": "stores nothing",
    "routes_progress.progress": "a job's own progress report, by its attempt's token",
}
READ = "read"
# what a path parameter names, as a target
_TARGETS = {"job_id": "job", "pool": "pool", "delivery_id": "notice-delivery",
            "name": "template"}


class Principal(Protocol):
    """Who calls (broker.api.auth.Principal, which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def team(self) -> str | None: ...

    @property
    def is_admin(self) -> bool: ...


@dataclass
class Note:
    """What a request's code learned that its record needs."""

    request_id: str
    actor: Principal | None = None
    target: str | None = None
    detail: dict[str, Any] | None = None
    read: str | None = None  # the target of an admin's read of another team's data
    recorded: bool = False  # its record is written already (InCommit)


_NOTE: contextvars.ContextVar[Note | None] = contextvars.ContextVar("isthmus_audit_note",
                                                                    default=None)


def current() -> Note | None:
    return _NOTE.get()


def saw_caller(who: Principal) -> None:
    """The request's caller, once authenticated (broker.api.auth)."""
    note = _NOTE.get()
    if note is not None:
        note.actor = who


def about(target: str, **detail: Any) -> None:
    """What the request acted on, as the route resolved it (a job's id for its number)."""
    note = _NOTE.get()
    if note is not None:
        note.target = target
        if detail:
            note.detail = {**(note.detail or {}), **detail}


def read_of(caller: Principal, team: str | None, target: str | None = None) -> None:
    """`caller` reads data of `team` (None: every team): recorded when an admin reads
    another team's."""
    note = _NOTE.get()
    if note is None or not caller.is_admin or (team is not None and team == caller.team):
        return
    note.read = target or (f"team:{team}" if team is not None else ALL_TEAMS)


def _endpoint_key(scope: Mapping[str, Any]) -> str | None:
    endpoint = scope.get("endpoint")
    if endpoint is None:
        return None
    return f"{endpoint.__module__.rsplit('.', 1)[-1]}.{endpoint.__name__}"


def _target(scope: Mapping[str, Any], note: Note, location: str | None) -> str:
    if note.target is not None:
        return note.target
    if location and location.startswith("/v1/jobs/"):
        return f"job:{location.removeprefix('/v1/jobs/')}"
    for param, value in (scope.get("path_params") or {}).items():
        kind = _TARGETS.get(param)
        if kind is not None:
            return f"{kind}:{value}"
    return "-"


def entry_of(scope: Mapping[str, Any], note: Note, status: int,
             location: str | None = None) -> Entry | None:
    """The request's record, or None when it is not one to record."""
    route = getattr(scope.get("route"), "path", None)
    if not isinstance(route, str) or status == 405 or note.recorded:
        return None  # no route matched (or none for this method): nothing was done
    method = scope["method"]
    actor = note.actor
    if method in ("GET", "HEAD"):
        admin_route = route.startswith("/v1/admin/")
        if note.read is None and not admin_route:
            return None
        action, target = READ, note.read or ALL_TEAMS
    else:
        key = _endpoint_key(scope)
        if (not route.startswith("/v1/") and key not in ACTIONS) or key in NOT_RECORDED:
            return None  # a dashboard post is recorded when it is one of ACTIONS
        action = ACTIONS.get(key or "", f"{method.lower()} {route}")
        target = _target(scope, note, location)
    return Entry(
        actor=actor.name if actor is not None else UNAUTHENTICATED,
        actor_team=actor.team if actor is not None else None,
        actor_admin=actor is not None and actor.is_admin,
        action=action, method=method, route=route, target=target,
        outcome=ALLOWED if status < 400 else REFUSED, status=status,
        request_id=note.request_id, detail=note.detail,
    )


@dataclass(frozen=True, slots=True)
class InCommit:
    """A record the route's own transaction writes (the submit's group commit): its entry
    but for the status and target, which that transaction learns."""

    entry: Entry
    note: Note

    def filled(self, status: int, target: str) -> Entry:
        return dataclasses.replace(self.entry, status=status, target=target,
                                   outcome=ALLOWED if status < 400 else REFUSED)

    def written(self) -> None:
        self.note.recorded = True


def in_commit(scope: MutableMapping[str, Any]) -> InCommit | None:
    """For a route that writes its own record in its transaction; None outside a request."""
    note = _NOTE.get()
    if note is None:
        return None
    entry = entry_of(scope, note, 0)
    return InCommit(entry, note) if entry is not None else None


class AuditWriter:
    """Group commit of the records of concurrent requests: those that arrive while a write is
    in flight share the next transaction, which stages them (the process's audit linker,
    `on_staged`, links them to the chain). The write runs in one worker thread (the commit
    waits there, not on the event loop)."""

    def __init__(self, db: Database, max_batch: int = 256,
                 on_staged: Callable[[], None] | None = None) -> None:
        self.db = db
        self.max_batch = max_batch
        self.on_staged = on_staged  # the process's audit linker (broker/api/audit_linker.py)
        self._pending: list[tuple[Entry, asyncio.Future[None]]] = []
        self._draining = False
        self._thread: ThreadPoolExecutor | None = None

    async def record(self, entry: Entry) -> None:
        """Once `entry` is committed. A failed write is logged, not raised: the call it
        records is done, and its answer must still reach the client."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((entry, fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        try:
            await fut
        except Exception:
            AUDIT_FAILED.inc()
            log.exception("audit record of %s %s by %s (request %s) not written",
                          entry.method, entry.route, entry.actor, entry.request_id)

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the records of answers already made join
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                if self._thread is None:
                    self._thread = ThreadPoolExecutor(1, thread_name_prefix="isthmus-audit")
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        self._thread, self._write, [e for e, _ in batch])
                except Exception as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                if self.on_staged is not None:
                    self.on_staged()
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._draining = False

    @on_conflict
    def _write(self, entries: list[Entry]) -> None:
        with self.db.write() as s:
            audit_log.stage(s, entries)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)


def _request_id(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            given = str(value.decode("latin-1")).strip()
            if _CLIENT_ID.fullmatch(given):
                return given
            break
    return uuid.uuid4().hex


class AuditTrail:
    """The middleware: a request id and a Note per request, and its record before its
    answer."""

    def __init__(self, app: Any, writer: AuditWriter) -> None:
        self.app = app
        self.writer = writer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        note = Note(_request_id(scope))
        token = _NOTE.set(note)
        started = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers") or [])
                location = next((v.decode("latin-1") for k, v in headers
                                 if k == b"location"), None)
                headers.append((b"x-request-id", note.request_id.encode()))
                message = {**message, "headers": headers}
                entry = entry_of(scope, note, message["status"], location)
                if entry is not None:
                    await self.writer.record(entry)
            await send(message)

        try:
            await self.app(scope, receive, answer)
        except Exception:
            # answered 500 by the server's outermost handler, outside this middleware
            entry = None if started else entry_of(scope, note, 500)
            if entry is not None:
                await self.writer.record(entry)
            raise
        finally:
            _NOTE.reset(token)
