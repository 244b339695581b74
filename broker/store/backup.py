"""Backup and restore of the whole Isthmus database (jobs, events, attempts, ledger, lease,
decisions) with each engine's own consistent-copy tool.

- SQLite: the online backup API of `sqlite3` (a consistent copy while the server runs, WAL
  included); a restore copies pages back the same way, and is refused while a server holds
  the database (its process lock).
- PostgreSQL: `pg_dump --format=custom` and `pg_restore --clean --if-exists
  --single-transaction` (all or nothing). The password travels in `PGPASSWORD`, never on a
  command line that `ps` shows; commands are argv lists, never shell text.
"""

from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from sqlalchemy.engine import make_url

from broker.store.db import normalise_url


class BackupError(RuntimeError):
    """A backup or restore could not be done; the message says why and what to do."""


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_path(url: str) -> Path:
    path = make_url(url).database
    if not path or path == ":memory:":
        raise BackupError(f"{url}: an in-memory SQLite database has nothing to back up")
    return Path(path)


def _pg_tool(name: str) -> str:
    """The newest installed PostgreSQL client tool (pg_dump refuses servers newer than it)."""
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit()
                        else 0)
    found = candidates[-1] if candidates else shutil.which(name)
    if not found:
        raise BackupError(f"{name} not found: install the PostgreSQL client "
                          "(Debian package postgresql-client)")
    return found


def _pg_target(url: str) -> tuple[str, dict[str, str]]:
    """A libpq URL without the password, and the environment that carries the password."""
    u = make_url(url).set(drivername="postgresql")
    env = dict(os.environ)
    if u.password is not None:
        env["PGPASSWORD"] = str(u.password)
        u = u.set(password=None)
    return u.render_as_string(hide_password=False), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    # argv of fixed tool paths and options; the URL and file are single arguments, no shell
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BackupError(f"{what} failed (exit {proc.returncode}): "
                          f"{detail[-1] if detail else 'no message'}")


def backup(url: str, dest: Path, *, overwrite: bool = False) -> None:
    """Write a consistent copy of the database at `url` to `dest`."""
    url = normalise_url(url)
    if dest.exists() and not overwrite:
        raise BackupError(f"{dest} exists; choose another file or pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if _is_sqlite(url):
        src_path = _sqlite_path(url)
        if not src_path.exists():
            raise BackupError(f"{src_path}: no such database")
        tmp = dest.with_name(dest.name + ".partial")
        tmp.unlink(missing_ok=True)
        with sqlite3.connect(f"file:{src_path}?mode=ro", uri=True) as src, \
                sqlite3.connect(tmp) as out:
            src.backup(out)
        os.replace(tmp, dest)  # a reader never sees half a backup
        return
    target, env = _pg_target(url)
    tmp = dest.with_name(dest.name + ".partial")
    _run([_pg_tool("pg_dump"), "--format=custom", f"--file={tmp}", f"--dbname={target}"],
         env, "pg_dump")
    os.replace(tmp, dest)


def restore(url: str, src: Path) -> None:
    """Replace the database at `url` with the backup `src` (made by `backup`)."""
    url = normalise_url(url)
    if not src.is_file():
        raise BackupError(f"{src}: no such backup file")
    if _is_sqlite(url):
        from broker.store.process_lock import DatabaseInUse, ProcessLock

        target = _sqlite_path(url)
        with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as probe:
            try:
                probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                raise BackupError(f"{src} is not an SQLite backup: {exc}") from None
        lock = ProcessLock(url)
        try:
            lock.acquire()
        except DatabaseInUse as exc:
            raise BackupError(f"{exc}; stop it before restoring") from None
        try:
            with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as back, \
                    sqlite3.connect(target) as live:
                back.backup(live)
        finally:
            lock.release()
        return
    target_url, env = _pg_target(url)
    _run([_pg_tool("pg_restore"), "--clean", "--if-exists", "--no-owner",
          "--single-transaction", f"--dbname={target_url}", str(src)], env, "pg_restore")
