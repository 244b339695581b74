"""`isthmus`: run the server, submit and inspect jobs, check the database and configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.cli import admin_views, jobs
from broker.cli.common import DEFAULT_URL, AsJson, ServerUrl, Token, call, fail
from broker.cli.output import console, emit_json
from broker.config import ConfigError, load_config

# rich_markup_mode=None: plain click help, where a boolean flag reads `--json`, not
# `--json <bool>`
app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__,
                  rich_markup_mode=None)
db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.", rich_markup_mode=None)
config_app = typer.Typer(no_args_is_help=True, help="Configuration checks.",
                         rich_markup_mode=None)
app.add_typer(db_app, name="db")
admin_app = typer.Typer(no_args_is_help=True, help="Platform operations (admin token).",
                        rich_markup_mode=None)
app.add_typer(config_app, name="config")
app.add_typer(admin_app, name="admin")
# The database URL carries a password: deployments pass it from a secret through this env var
# rather than writing it into isthmus.yaml.
DB_ENV = "ISTHMUS_DATABASE_URL"
DbUrl = Annotated[
    str | None, typer.Option("--db", envvar=DB_ENV, help="database URL", show_default=False)
]


_fail = fail
_call = call


@app.command()
def server(
    config: Annotated[Path, typer.Option("--config", "-c", help="isthmus.yaml")],
    db: Annotated[
        str | None,
        typer.Option("--db", envvar=DB_ENV, help="database URL (overrides config)"),
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="listen address (overrides server.host)")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="listen port (overrides server.port)")
    ] = None,
    control: Annotated[
        bool, typer.Option("--control/--no-control", help="run the control loop when leading")
    ] = True,
    workers: Annotated[
        int, typer.Option(
            "--workers", min=1,
            help="API worker processes on the one port (PostgreSQL only; each a replica: "
            "the leader lease lets exactly one of them run the control loop)",
        ),
    ] = 1,
) -> None:
    """Run the API server (and, when it holds the lease, the control loop)."""
    from broker.server import ServerError, run

    try:
        run(config, db_url=db, host=host, port=port, control=control, workers=workers)
    except (ConfigError, ServerError) as exc:
        _fail(str(exc))


@app.command()
def control(
    config: Annotated[Path, typer.Option("--config", "-c", help="isthmus.yaml")],
    db: DbUrl = None,
    api_host: Annotated[
        str | None, typer.Option("--api-host", help="where the API is reached (server.host)")
    ] = None,
    api_port: Annotated[
        int | None, typer.Option("--api-port", help="the API's port (server.port)")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="serve this process's metrics here")
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="address of the metrics listener")
    ] = "127.0.0.1",
) -> None:
    """Run the control loop without the API (PostgreSQL): a replica that leads when it holds
    the lease; pair it with `isthmus server --no-control`."""
    from broker.control_only import run_control
    from broker.server import ServerError

    try:
        run_control(config, db_url=db, api_host=api_host, api_port=api_port,
                    metrics=(metrics_host, metrics_port) if metrics_port else None)
    except (ConfigError, ServerError) as exc:
        _fail(str(exc))


for _name, _fn in jobs.COMMANDS + admin_views.COMMANDS:
    app.command(_name)(_fn)
admin_app.command("cycles")(admin_views.admin_cycles)
app.add_typer(admin_views.report_app, name="report")


@app.command()
def snapshot(
    job_id: str,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: the last)")] = None,
    server: ServerUrl = DEFAULT_URL, token: Token = None,
) -> None:
    """Export what reproducing an attempt needs (JSON): its immutable run snapshot and what it
    ran with (image digest, GPU models, nodes), resolved when its ranks started."""
    if attempt is None:
        rows = call(server, token, "attempts", job_id)
        if not rows:
            fail(f"job {job_id} has no attempt yet", code=1)
        attempt = rows[-1]["number"]
    emit_json(call(server, token, "snapshot", job_id, attempt))


@admin_app.command("pools")
def admin_pools(server: ServerUrl = DEFAULT_URL, token: Token = None,
                as_json: AsJson = False) -> None:
    """Pools with their drain state."""
    pools = _call(server, token, "pools")
    if as_json:
        emit_json(pools)
        return
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    for col in ("POOL", "BACKEND", "FLAVOR", "DRAINED", "REASON", "BY"):
        t.add_column(col)
    for p in pools:
        t.add_row(p["name"], p["backend"], p["flavor"], "yes" if p["drained"] else "no",
                  p["reason"], p["changed_by"] or "")
    console.print(t)


@admin_app.command("drain")
def admin_drain(pool: Annotated[str, typer.Argument(help="the pool's name")],
                reason: Annotated[str, typer.Option("--reason", help="why (shown to users)")]
                = "",
                server: ServerUrl = DEFAULT_URL, token: Token = None,
                as_json: AsJson = False) -> None:
    """Admit nothing more to POOL (running jobs keep running)."""
    p = _call(server, token, "drain", pool, reason)
    emit_json(p) if as_json else console.print(f"{p['name']}: drained ({p['reason']})",
                                               markup=False)


@admin_app.command("undrain")
def admin_undrain(pool: Annotated[str, typer.Argument(help="the pool's name")],
                  server: ServerUrl = DEFAULT_URL, token: Token = None,
                  as_json: AsJson = False) -> None:
    """Admit to POOL again."""
    p = _call(server, token, "undrain", pool)
    if as_json:
        emit_json(p)
        return
    console.print(f"{p['name']}: {'still drained by configuration' if p['drained'] else 'open'}",
                  markup=False)


@admin_app.command("usage")
def admin_usage(server: ServerUrl = DEFAULT_URL, token: Token = None,
                as_json: AsJson = False) -> None:
    """Live quota usage per team and flavor."""
    rows = _call(server, token, "usage")
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        console.print(f"{r['team']:<16} {r['flavor']:<12} {r['reserved_gpus']:>6} GPUs "
                      f"({r['borrowed_gpus']} borrowed)")


def _db_url(db: str | None, config: Path | None) -> str:
    if db is not None:
        return db
    if config is None:
        _fail(f"give --db URL (or {DB_ENV}) or --config FILE")
    try:
        return load_config(config).database
    except ConfigError as exc:
        _fail(str(exc))


@db_app.command("upgrade")
def db_upgrade(
    db: DbUrl = None,
    as_json: AsJson = False,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
    ] = None,
) -> None:
    """Apply the schema migrations up to the newest (what `server` also does at start-up);
    safe to run from several places at once: replicas migrate one at a time."""
    from broker.store.db import DatabaseURLError, connect
    from broker.store.migrate import upgrade

    url = _db_url(db, config)
    try:
        database = connect(url)
    except DatabaseURLError as exc:
        _fail(str(exc))
    try:
        upgrade(database)
        from sqlalchemy import text

        with database.read() as s:
            head = s.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    except Exception as exc:
        _fail(f"cannot migrate {database.dialect} database: {exc.__class__.__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        database.dispose()
    if as_json:
        emit_json({"revision": head})
    else:
        console.print(f"database schema at revision {head}")


@db_app.command("check")
def db_check(
    db: DbUrl = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Rebuild every job from its events and compare with the stored rows, the quota counters
    and the ledger's daily sums with the ledger's entries (exit 1 on mismatch)."""
    from broker import ledger
    from broker.orchestration.replay import check_all
    from broker.store import daily_sums
    from broker.store.db import DatabaseURLError, connect, masked

    db = _db_url(db, config)
    try:
        database = connect(db)
    except DatabaseURLError as exc:
        _fail(str(exc))
    checked = 0
    mismatches = []
    ledger_problems: list[str] = []
    try:
        with database.read() as s:
            from sqlalchemy import func, select

            from broker.store.records import JOBS

            checked = s.execute(select(func.count()).select_from(JOBS)).scalar_one()
            mismatches = list(check_all(s))
            ledger_problems = ledger.check(s) + daily_sums.mismatches(s)
    except Exception as exc:
        _fail(f"cannot read {masked(db)}: {exc.__class__.__name__}: "
              f"{str(exc).splitlines()[0]}")
    finally:
        database.dispose()
    if as_json:
        emit_json(
            {
                "jobs": checked,
                "mismatches": [m.__dict__ for m in mismatches],
                "ledger": ledger_problems,
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
        console.print(
            f"checked {checked} jobs: {len(mismatches)} mismatches, "
            f"{len(ledger_problems)} ledger problems"
        )
    if mismatches or ledger_problems:
        raise typer.Exit(1)


@db_app.command("rebuild-sums")
def db_rebuild_sums(
    db: DbUrl = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Write the ledger's daily sums (ledger_daily, read by `isthmus report`) anew from its
    entries, in one transaction: after `db check` reported them drifted, e.g. entries booked
    by a replica of a version before schema revision 0013 while an upgrade rolled."""
    from broker.store import daily_sums
    from broker.store.db import DatabaseURLError, connect, masked

    url = _db_url(db, config)
    try:
        database = connect(url)
    except DatabaseURLError as exc:
        _fail(str(exc))
    try:
        with database.write() as s:
            rows = daily_sums.rebuild(s)
    except Exception as exc:
        _fail(f"cannot rebuild the daily sums of {masked(url)}: {exc.__class__.__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        database.dispose()
    if as_json:
        emit_json({"ledger_daily_rows": rows})
    else:
        console.print(f"ledger_daily rebuilt from the entries: {rows} rows")


@db_app.command("backup")
def db_backup(
    file: Annotated[Path, typer.Argument(help="where to write the backup")],
    db: DbUrl = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
    ] = None,
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
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="isthmus.yaml naming the database")
    ] = None,
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


@config_app.command("check")
def config_check(
    file: Annotated[Path, typer.Argument(help="the isthmus.yaml to check")],
    as_json: AsJson = False,
    show: Annotated[bool, typer.Option(
        "--show", help="also print every policy parameter in effect (defaults filled in)")
    ] = False,
) -> None:
    """Validate an isthmus.yaml and print a summary."""
    from broker.wiring.runtime import check_backends

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        _fail(str(exc), code=1)
    problems = check_backends(cfg)  # the server refuses to start on these too
    if problems:
        _fail("\n".join(f"{file}: {line}" for line in problems), code=1)
    if as_json:
        emit_json({"file": str(file), "ok": True, "backends": len(cfg.backends),
                   "pools": len(cfg.pools), "flavors": len(cfg.flavors),
                   "teams": len(cfg.teams), "auth": cfg.auth.mode,
                   **({"policies": cfg.policies.model_dump(mode="json")} if show else {})})
        return
    console.print(
        f"{file}: OK: {len(cfg.backends)} backends, {len(cfg.pools)} pools, "
        f"{len(cfg.flavors)} flavors, {len(cfg.teams)} teams, auth {cfg.auth.mode}",
        markup=False,
    )
    if show:
        import yaml

        shown = {"policies": cfg.policies.model_dump(mode="json")}
        print(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False), end="")


if __name__ == "__main__":
    app()
