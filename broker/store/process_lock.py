"""SQLite allows one server process: a second one is refused with a clear message."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url


class DatabaseInUse(RuntimeError):
    pass


class ProcessLock:
    """An exclusive, non-blocking flock on `<database>.lock`, held for the process lifetime."""

    def __init__(self, url: str) -> None:
        db_path = make_url(url).database or ""
        self.path = Path(f"{db_path}.lock")
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held open until release()
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise DatabaseInUse(
                f"another Isthmus server (pid {holder}) is using {self.path.with_suffix('')}; "
                "SQLite allows one server process. Stop it, or use PostgreSQL "
                "(database: postgresql://...) to run several replicas."
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
