"""List + watch of one resource kind into an in-memory cache, in a background thread.

One `Reflector` per kind (Isthmus Jobs, Isthmus Pods, Nodes), never one per job. It lists to
get a consistent snapshot and its resourceVersion, then watches from there with bookmarks
(so the version stays fresh even when nothing changes). A watch that ends (server timeout) is
resumed from the last version; an ERROR 410 Gone (the version was compacted) causes a re-list;
a broken connection is retried with exponential backoff, and while it is broken the cache is
reported unhealthy so that readers fall back to a direct list (which raises BackendUnavailable
when the API server is really gone).
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from backends.base import BackendUnavailable
from backends.k8s.client import ApiError, translated
from broker.logs import get_logger

log = get_logger(__name__)

Lister = Callable[..., Any]
"""A generated list method with its namespace / selectors bound (functools.partial)."""


class Gone(Exception):
    """The resourceVersion we watch from is too old (410): re-list."""


def key_of(obj: Mapping[str, Any]) -> str:
    """The cache key of an object ('namespace/name')."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as cached: without `metadata.managedFields` (the server-side-apply
    bookkeeping, often the largest part of an object, read by nothing here), as client-go
    informers' transforms drop it."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def iter_lines(resp: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while True:
            nl = buffer.find(b"\n")
            if nl < 0:
                break
            line, buffer = buffer[:nl], buffer[nl + 1:]
            if line.strip():
                yield line


class Reflector:
    """Keeps `objects` (key 'namespace/name' -> API JSON) in step with the API server."""

    def __init__(self, kind: str, lister: Lister, *, timeout: float = 15.0,
                 watch_timeout_s: int = 300, max_backoff_s: float = 10.0,
                 resume_from: str = "") -> None:
        self.kind = kind
        self.lister = lister
        self.timeout = timeout
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = resume_from  # watch from here first (else list first)
        self.synced = False  # a list has completed
        self.connected = False  # the watch stream is open (or we just listed)
        self.last_error = ""
        self.relists = 0  # counters, for tests and metrics
        self.reconnects = 0
        self.events = 0
        self.on_change: Callable[[], None] | None = None
        """Called (in the watch thread, outside the lock) after each object event: a hook
        for whoever wants to act on a change at once instead of at its next poll. It must
        be quick; an exception from it is logged and the watch goes on."""
        self._lock = threading.RLock()  # predicates of wait_for read under it
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition(self._lock)

    # -- reading --------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.synced and self.connected

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self.objects.get(key)

    def forget(self, keys: list[str]) -> int:
        """Drop objects from the cache (they stay in the cluster); a later event of one
        puts it back. Returns how many were dropped."""
        with self._lock:
            return sum(self.objects.pop(k, None) is not None for k in keys)

    def wait_for(self, predicate: Callable[[Reflector], bool], timeout: float) -> bool:
        """Block until predicate(self) holds after some change (for tests)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    # -- listing --------------------------------------------------------------------------
    def list_now(self) -> tuple[list[dict[str, Any]], str]:
        """One direct list (the fallback when the watch is not healthy)."""
        with translated(f"list {self.kind}"):
            resp = self.lister(_preload_content=False, _request_timeout=self.timeout)
            data = json.loads(resp.data)
        items = [_slim(o) for o in data.get("items") or ()]
        return items, str((data.get("metadata") or {}).get("resourceVersion") or "")

    def relist(self) -> None:
        items, rv = self.list_now()
        with self._changed:
            self.objects = {key_of(o): o for o in items}
            self.resource_version = rv
            self.synced = True
            self.connected = True
            self.relists += 1
            self._changed.notify_all()

    # -- watching -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"k8s-watch-{self.kind}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.break_stream()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def break_stream(self) -> None:
        """Close the open watch response (the loop then reconnects); also used by tests."""
        resp = self._resp
        if resp is None:
            return
        # close() would wait for the reader's lock on the TLS socket; shutdown wakes it
        conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
        sock = getattr(conn, "sock", None)
        with contextlib.suppress(OSError):
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        backoff = 0.2
        need_list = not self.resource_version
        while not self._stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self._watch_once()
                backoff = 0.2
            except Gone:
                log.info("watch %s: resourceVersion %s is gone; re-listing", self.kind,
                         self.resource_version)
                need_list = True
            except (BackendUnavailable, ApiError, ValueError, OSError) as exc:
                self._broken(str(exc))
                self._stop.wait(backoff * (1 + random.random() / 2))  # noqa: S311 - jitter
                backoff = min(backoff * 2, self.max_backoff_s)
            except Exception as exc:  # a urllib3 read error mid-stream, a bug: keep going
                if self._stop.is_set():
                    break
                self._broken(f"{type(exc).__name__}: {exc}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)

    def _broken(self, why: str) -> None:
        if self._stop.is_set():
            return
        with self._changed:
            self.connected = False
            self.last_error = why
            self.reconnects += 1
            self._changed.notify_all()
        log.warning("watch %s broken (%s); reconnecting", self.kind, why)

    def _watch_once(self) -> None:
        try:
            resp = self._open()
        except ApiError as exc:
            if exc.status == 410:
                raise Gone(exc.reason) from None
            raise
        self._consume(resp)

    def _open(self) -> Any:
        with translated(f"watch {self.kind}"):
            return self.lister(
                watch=True, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                _preload_content=False,
                _request_timeout=(self.timeout, self.watch_timeout_s + self.timeout),
            )

    def _consume(self, resp: Any) -> None:
        self._resp = resp
        with self._changed:
            self.connected = True
            self._changed.notify_all()
        try:
            for line in iter_lines(resp):
                if self._stop.is_set():
                    return
                self._apply(json.loads(line))
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = _slim(event.get("object") or {})
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message", "")))
            raise ApiError(int(obj.get("code") or 0), str(obj.get("message", "")), obj)
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        with self._changed:
            if kind in ("ADDED", "MODIFIED"):
                self.objects[key_of(obj)] = obj
            elif kind == "DELETED":
                self.objects.pop(key_of(obj), None)
            if rv:
                self.resource_version = rv
            self.events += 1
            self._changed.notify_all()
        if kind in ("ADDED", "MODIFIED", "DELETED") and self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a listener's bug must not stop the watch
                log.exception("watch %s: the change listener failed", self.kind)
