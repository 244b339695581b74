"""`isthmus db ...`: schema upgrades, the consistency check and its repair, backups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.cli.common import AsJson, fail
from broker.cli.output import console, emit_json

if TYPE_CHECKING:
    from broker.store.db import Database

db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.", rich_markup_mode=None)
# The database URL carries a password: deployments pass it from a secret through this env var
# rather than writing it into isthmus.yaml.
DB_ENV = "ISTHMUS_DATABASE_URL"
DbUrl = Annotated[
    str | None, typer.Option("--db", envvar=DB_ENV, help="database URL", show_default=False)
]

ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
]

_fail = fail


def _db_url(db: str | None, config: Path | None) -> str:
    if db is not None:
        return db
    if config is None:
        _fail(f"give --db URL (or {DB_ENV}) or --config FILE")
    from broker.config import ConfigError, load_config

    try:
        return load_config(config).database
    except ConfigError as exc:
        _fail(str(exc))


@contextlib.contextmanager
def _opened(db: str | None, config: Path | None, doing: str) -> Iterator[Database]:
    """The database named by --db or --config, disposed after; a URL that does not parse and
    any error of the body exit 2 with one line (`cannot <doing> <URL, password masked>: ...`)."""
    from broker.store.db import DatabaseURLError, connect, masked

    url = _db_url(db, config)
    try:
        database = connect(url)
    except DatabaseURLError as exc:
        _fail(str(exc))
    try:
        yield database
    except typer.Exit:
        raise
    except Exception as exc:
        _fail(f"cannot {doing} {masked(url)}: {exc.__class__.__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        database.dispose()


@db_app.command("upgrade")
def db_upgrade(
    db: DbUrl = None,
    as_json: AsJson = False,
    config: ConfigFile = None,
) -> None:
    """Apply the schema migrations up to the newest (what `server` also does at start-up);
    safe to run from several places at once: replicas migrate one at a time."""
    from sqlalchemy import text

    from broker.store.migrate import upgrade

    with _opened(db, config, "migrate") as database:
        upgrade(database)
        with database.read() as s:
            head = s.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    if as_json:
        emit_json({"revision": head})
    else:
        console.print(f"database schema at revision {head}")


@db_app.command("check")
def db_check(
    db: DbUrl = None,
    config: ConfigFile = None,
    as_json: AsJson = False,
) -> None:
    """Rebuild every job from its events and compare with the stored rows, the quota counters
    and the ledger's daily sums with the ledger's entries, and verify the audit log's hash
    chain, naming its first changed row (exit 1 on any mismatch)."""
    from dataclasses import asdict

    from sqlalchemy import func, select

    from broker import ledger
    from broker.orchestration.replay import check_all
    from broker.store import audit_log, daily_sums
    from broker.store.records import JOBS

    # one snapshot: a transition committed between two of its reads is no mismatch
    with _opened(db, config, "read") as database, database.snapshot() as s:
        checked = s.execute(select(func.count()).select_from(JOBS)).scalar_one()
        mismatches = list(check_all(s))
        ledger_problems = ledger.check(s) + daily_sums.mismatches(s)
        audit = audit_log.verify(s)
        staged = audit_log.staged_count(s)  # committed, not linked yet: linked within seconds
    if as_json:
        emit_json(
            {
                "jobs": checked,
                "mismatches": [asdict(m) for m in mismatches],
                "ledger": ledger_problems,
                "audit": {"rows": audit.rows, "staged": staged,
                          "broken": asdict(audit.broken) if audit.broken else None},
            }
        )
    else:
        for m in mismatches:
            console.print(
                f"[red]MISMATCH[/] job {m.job_id} {m.field}: stored={m.stored!r} "
                f"replayed={m.replayed!r}"
            )
        for line in ledger_problems:
            console.print(f"[red]LEDGER[/] {line}")
        if audit.broken is not None:
            console.print(f"[red]AUDIT[/] {audit.broken}")
        console.print(
            f"checked {checked} jobs: {len(mismatches)} mismatches, "
            f"{len(ledger_problems)} ledger problems; audit log "
            + (f"{audit.rows} rows, chain intact" if audit.broken is None
               else f"chain broken at row {audit.broken.seq}")
            + (f" ({staged} records staged, to be linked)" if staged else "")
        )
    if mismatches or ledger_problems or audit.broken is not None:
        raise typer.Exit(1)


@db_app.command("rebuild-sums")
def db_rebuild_sums(
    db: DbUrl = None,
    config: ConfigFile = None,
    as_json: AsJson = False,
) -> None:
    """Write the ledger's daily sums (ledger_daily, read by `isthmus report`) anew from its
    entries, in one transaction: after `db check` reported them drifted, e.g. entries booked
    by a replica of a version before schema revision 0013 while an upgrade rolled."""
    from broker.store import daily_sums

    with _opened(db, config, "rebuild the daily sums of") as database, database.write() as s:
        rows = daily_sums.rebuild(s)
    if as_json:
        emit_json({"ledger_daily_rows": rows})
    else:
        console.print(f"ledger_daily rebuilt from the entries: {rows} rows")


@db_app.command("backup")
def db_backup(
    file: Annotated[Path, typer.Argument(help="where to write the backup")],
    db: DbUrl = None,
    config: ConfigFile = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing file")] = False,
    as_json: AsJson = False,
) -> None:
    """A consistent copy of the whole database while the broker runs (SQLite backup API,
    or pg_dump --format=custom on PostgreSQL)."""
    from broker.store.backup import BackupError, backup
    from broker.store.db import DatabaseURLError

    try:
        backup(_db_url(db, config), file, overwrite=force)
    except (BackupError, DatabaseURLError) as exc:
        _fail(str(exc))
    if as_json:
        emit_json({"backup": str(file)})
    else:
        console.print(f"backup written to {file}", markup=False)


@db_app.command("restore")
def db_restore(
    file: Annotated[Path, typer.Argument(help="a backup made by `isthmus db backup`")],
    db: DbUrl = None,
    config: ConfigFile = None,
    yes: Annotated[bool, typer.Option("--yes", help="confirm: replaces the database")] = False,
    as_json: AsJson = False,
) -> None:
    """Replace the database with a backup (stop every broker replica first). All or nothing;
    run `isthmus db upgrade` and `isthmus db check` afterwards."""
    from broker.store.backup import BackupError, restore
    from broker.store.db import DatabaseURLError

    if not yes:
        _fail("restore replaces every job, event and ledger entry in the database; "
              "stop the broker and pass --yes")
    try:
        restore(_db_url(db, config), file)
    except (BackupError, DatabaseURLError) as exc:
        _fail(str(exc))
    if as_json:
        emit_json({"restored": str(file)})
        return
    console.print(f"database restored from {file}; now run `isthmus db upgrade` and "
                  "`isthmus db check`")
