"""Progress and checkpoints of simulated jobs, reported through the broker's real progress
endpoint (`POST /v1/jobs/{id}/progress` with the attempt's ISTHMUS_PROGRESS_TOKEN), the way
training code does it.

A simulated job's step is the number of simulated seconds of useful work it has done (work
restored from a checkpoint included). It reports every `every` simulated seconds once all its
ranks run, and, when its spec has a checkpoint directory and interval, writes a checkpoint
every interval, reported with the step. The backend remembers the last checkpoint of each job
(the simulated file system): a resumable job's next attempt starts from it.

Reports are posted from one background thread, never inside a backend call: the server that
answers them may be the process making that call.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.client
import json
import os
import queue
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from broker.logs import get_logger

PROGRESS_TOKEN_ENV = "ISTHMUS_PROGRESS_TOKEN"  # noqa: S105 - the name of an env var

log = get_logger(__name__)


@dataclass(slots=True)
class Reporting:
    """What one attempt reports, and what it reported last."""

    job_id: str
    attempt: int
    token: str | None
    """None: nowhere to report (checkpoints are still written)."""
    every: float
    checkpoint_dir: str | None
    checkpoint_every: float | None
    last_report: float = float("-inf")
    """Simulated time of the last report."""
    last_checkpoint: int = -1
    """Step of the last checkpoint written by this attempt."""

    def due(self, t: float, step: int) -> tuple[bool, str | None]:
        """(report now?, checkpoint path written now) at simulated time `t`."""
        path = None
        if self.checkpoint_dir and self.checkpoint_every:
            mark = int(step // self.checkpoint_every * self.checkpoint_every)
            if mark > 0 and mark > self.last_checkpoint:
                self.last_checkpoint = mark
                path = f"{self.checkpoint_dir.rstrip('/')}/step-{mark}"
        report = self.token is not None and (path is not None or t - self.last_report >= self.every)
        if report:
            self.last_report = t
        return report, path


def _running() -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Report:
    job_id: str
    token: str
    step: int
    checkpoint: str | None
    running: Callable[[], bool] = _running
    """Whether the attempt still runs, asked when the report's turn to be sent comes: the
    report of an attempt that has ended since is dropped, as a pod that has ended sends
    nothing (counted as `ended`, not sent)."""


class _Poster:
    """One sender's connection to the API, kept alive between its reports (the standard
    library's http.client: httpx cost the process running the simulator about three times the
    CPU per report, 1.19 against 0.40 ms, which the soak charged to the machine the broker
    shares). A kept-alive connection the server closed meanwhile is met at the next report,
    which is then sent once more on a new connection (a report sent twice is harmless: it sets
    the step, it adds nothing)."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        self._new = functools.partial(
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection,
            parts.hostname or "localhost", parts.port, timeout=timeout)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: str, token: str) -> tuple[int, str]:
        """(status, body) of a JSON POST to `path` with `token` as its bearer."""
        reused = self._conn is not None
        try:
            return self._send(path, body, token)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        return self._send(path, body, token)  # the kept one had been closed: a new one

    def _send(self, path: str, body: str, token: str) -> tuple[int, str]:
        if self._conn is None:
            self._conn = self._new()
        try:
            self._conn.request("POST", self._prefix + path, body=body.encode(), headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
            resp = self._conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Reporter:
    """Posts reports to `url` from `senders` daemon threads (a job's pods report in parallel:
    one thread sending one request at a time fell behind at 50 jobs/s, and its reports came
    after their attempts had ended); a full queue drops the oldest report (the next one says
    more), and a refused report (the attempt ended) is dropped.

    The answers are counted by class (`answers`: 2xx, 4xx, 5xx, unreachable; `ended`, the
    reports not sent because their attempt had ended while they waited; `dropped`, the oldest
    ones pushed out of a full queue): their sum is the load the jobs offered. A 5xx is logged
    at WARNING, each one (a job's report the server failed), and the counts so far at INFO at
    most every `tally_every` seconds (`TALLY`, with the process id and the reporter's `name`,
    its backend's: a process runs one per simulated backend), and once more when the process
    exits (the counts are then final, but for a process killed). bench/soak.py counts the 5xx
    lines and reads the last tally of each reporter, so a server error answering a job is
    counted as one of the soak's."""

    TALLY = "progress reports answered so far (pid {pid}, {name}): {counts}"

    def __init__(self, url: str, timeout: float = 5.0, capacity: int = 10_000,
                 senders: int = 4, tally_every: float = 30.0, name: str = "sim") -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.senders = senders
        self._queue: queue.Queue[Report] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.answers: Counter[str] = Counter()
        self.tally_every = tally_every
        self._tallied = time.monotonic()

    def send(self, report: Report) -> None:
        with self._lock:
            if self._thread is None:
                atexit.register(self.tally)
                for i in range(self.senders):
                    self._thread = threading.Thread(target=self._run, name=f"sim-progress-{i}",
                                                    daemon=True)
                    self._thread.start()
        while True:
            try:
                self._queue.put_nowait(report)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                    self._queue.task_done()
                    self._count("dropped")

    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def _run(self) -> None:
        poster = _Poster(self.url, self.timeout)
        try:
            while True:
                r = self._queue.get()
                try:
                    if r.running():
                        self._post(poster, r)
                    else:
                        self._count("ended")
                finally:
                    self._queue.task_done()
        finally:
            poster.close()

    def _post(self, poster: _Poster, r: Report) -> None:
        body: dict[str, object] = {"step": r.step}
        if r.checkpoint:
            body["checkpoint"] = r.checkpoint
        try:
            status, text = poster.post(f"/v1/jobs/{r.job_id}/progress", json.dumps(body),
                                       r.token)
        except (OSError, http.client.HTTPException) as exc:
            self._count("unreachable")
            log.debug("progress of %s not delivered: %r", r.job_id, exc)
            return
        self._count(f"{status // 100}xx")
        if status >= 500:
            log.warning("progress of %s answered %s: %s", r.job_id, status, text[:200])
        elif status >= 300:
            log.debug("progress of %s refused: %s %s", r.job_id, status, text[:200])

    def _count(self, answer: str) -> None:
        with self._lock:  # several senders
            self.answers[answer] += 1
            now = time.monotonic()
            if now - self._tallied >= self.tally_every:
                self._tallied = now
                self._tally()

    def tally(self) -> None:
        """Log the counts so far."""
        with self._lock:
            self._tally()

    def _tally(self) -> None:
        # logged with the lock held: a later line never carries older counts than one before
        log.info(self.TALLY.format(pid=os.getpid(), name=self.name,
                                   counts=dict(sorted(self.answers.items()))))
