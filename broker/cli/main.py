"""`isthmus`: run the server, submit and inspect jobs, check the database and configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml

from broker.cli.output import console, emit_json, errors, events_table, job_detail, job_table
from broker.cli.output import problem as show_problem
from broker.client import ApiError, Client
from broker.config import ConfigError, load_config

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.")
config_app = typer.Typer(no_args_is_help=True, help="Configuration checks.")
app.add_typer(db_app, name="db")
admin_app = typer.Typer(no_args_is_help=True, help="Platform operations (admin token).")
app.add_typer(config_app, name="config")
app.add_typer(admin_app, name="admin")

ServerUrl = Annotated[
    str, typer.Option("--server", envvar="ISTHMUS_URL", help="API base URL")
]
Token = Annotated[
    str | None,
    typer.Option("--token", envvar="ISTHMUS_TOKEN", help="API token (prefer the env var)",
                 show_default=False),
]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]
# The database URL carries a password: deployments pass it from a secret through this env var
# rather than writing it into isthmus.yaml.
DB_ENV = "ISTHMUS_DATABASE_URL"
DbUrl = Annotated[
    str | None, typer.Option("--db", envvar=DB_ENV, help="database URL", show_default=False)
]
DEFAULT_URL = "http://127.0.0.1:8080"


def _fail(message: str, code: int = 2) -> NoReturn:
    errors.print(f"[bold red]error[/]: {message}")
    raise typer.Exit(code)


def _call(server: str, token: str | None, fn: str, *args: Any) -> Any:
    try:
        with Client(server, token) as c:
            return getattr(c, fn)(*args)
    except ApiError as exc:
        show_problem(exc.status, exc.problem)
        raise typer.Exit(1) from None
    except OSError as exc:  # httpx transport errors derive from OSError-like classes below
        _fail(f"cannot reach the Isthmus API at {server}: {exc}")
    except Exception as exc:
        if exc.__class__.__module__.startswith("httpx"):
            _fail(f"cannot reach the Isthmus API at {server}: {exc}")
        raise


@app.command()
def server(
    config: Annotated[Path, typer.Option("--config", "-c", help="isthmus.yaml")],
    db: Annotated[
        str | None,
        typer.Option("--db", envvar=DB_ENV, help="database URL (overrides config)"),
    ] = None,
    host: Annotated[str | None, typer.Option("--host")] = None,
    port: Annotated[int | None, typer.Option("--port")] = None,
    control: Annotated[
        bool, typer.Option("--control/--no-control", help="run the control loop when leading")
    ] = True,
) -> None:
    """Run the API server (and, when it holds the lease, the control loop)."""
    from broker.server import ServerError, run

    try:
        run(config, db_url=db, host=host, port=port, control=control)
    except (ConfigError, ServerError) as exc:
        _fail(str(exc))


def _read_spec(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text() if str(path) != "-" else typer.get_text_stream("stdin").read()
    except OSError as exc:
        _fail(f"{path}: {exc.strerror}")
    try:
        data = (
            json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        )
    except (ValueError, yaml.YAMLError) as exc:
        _fail(f"{path}: not valid JSON/YAML: {exc}")
    if not isinstance(data, dict):
        _fail(f"{path}: a job spec must be a mapping")
    return data


@app.command()
def submit(
    file: Annotated[Path, typer.Option("-f", "--file", help="job spec (.json or .yaml)")],
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    server: ServerUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Submit a job spec."""
    job = _call(server, token, "submit", _read_spec(file), idempotency_key)
    if as_json:
        emit_json(job)
    else:
        console.print(f"[bold]{job['id']}[/] {job['state']} ({job['reason']}): {job['message']}")


@app.command()
def status(
    job_id: str, server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Show one job: state, reason and message."""
    job = _call(server, token, "job", job_id)
    emit_json(job) if as_json else console.print(job_detail(job))


@app.command("list")
def list_(
    team: Annotated[str | None, typer.Option()] = None,
    state: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    limit: Annotated[int, typer.Option()] = 50,
    server: ServerUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    page = _call(server, token, "jobs", team, state, limit)
    emit_json(page) if as_json else console.print(job_table(page["items"]))


@app.command()
def events(
    job_id: str, server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Show a job's event history."""
    evs = _call(server, token, "events", job_id)
    emit_json(evs) if as_json else console.print(events_table(evs))


@app.command()
def explain(
    job_id: str, server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Why a job waits: the latest admission verdicts per pool, most severe reason first."""
    from policies.explain import Explanation

    data = _call(server, token, "explain", job_id)
    if as_json:
        emit_json(data)
        return
    console.print(f"[bold]{job_id}[/] {data['state']} ({data['reason']}): {data['message']}")
    if data["explanation"] is None:
        console.print("  not yet considered by an admission cycle")
        return
    console.print(f"  as of {data['considered_at']}")
    console.print(Explanation.model_validate(data["explanation"]).to_text(), markup=False)


@app.command()
def render(
    job_id: str,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: the last)")] = None,
    server: ServerUrl = DEFAULT_URL, token: Token = None,
) -> None:
    """Print the exact batch script or manifests an attempt was created with."""
    if attempt is None:
        attempts = _call(server, token, "attempts", job_id)
        made = [a for a in attempts if a["dispatch"] == "created"]
        if not made:
            _fail(f"job {job_id} has no backend object yet", code=1)
        attempt = made[-1]["number"]
    print(_call(server, token, "render", job_id, attempt), end="")


@app.command()
def cancel(
    job_id: str, server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Cancel a job that has not ended."""
    job = _call(server, token, "cancel", job_id)
    if as_json:
        emit_json(job)
    else:
        console.print(f"[bold]{job['id']}[/] {job['state']} ({job['reason']})")


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
def admin_drain(pool: str, reason: Annotated[str, typer.Option("--reason")] = "",
                server: ServerUrl = DEFAULT_URL, token: Token = None) -> None:
    """Admit nothing more to POOL (running jobs keep running)."""
    p = _call(server, token, "drain", pool, reason)
    console.print(f"{p['name']}: drained ({p['reason']})")


@admin_app.command("undrain")
def admin_undrain(pool: str, server: ServerUrl = DEFAULT_URL, token: Token = None) -> None:
    """Admit to POOL again."""
    p = _call(server, token, "undrain", pool)
    console.print(f"{p['name']}: {'still drained by configuration' if p['drained'] else 'open'}")


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
    config: Annotated[Path | None, typer.Option("--config", "-c")] = None,
) -> None:
    """Apply the schema migrations up to the newest (what `server` also does at start-up);
    safe to run from several places at once: replicas migrate one at a time."""
    from broker.store.db import DatabaseURLError, open_database
    from broker.store.migrate import upgrade

    url = _db_url(db, config)
    try:
        database = open_database(url, migrate=False)
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
    console.print(f"database schema at revision {head}")


@db_app.command("check")
def db_check(
    db: DbUrl = None,
    config: Annotated[Path | None, typer.Option("--config", "-c")] = None,
    as_json: AsJson = False,
) -> None:
    """Rebuild every job from its events and compare with the stored rows (exit 1 on mismatch)."""
    from broker import ledger
    from broker.orchestration.replay import check_all
    from broker.store.db import DatabaseURLError, open_database

    db = _db_url(db, config)
    try:
        database = open_database(db, migrate=False)
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
            ledger_problems = ledger.check(s)
    except Exception as exc:
        _fail(f"cannot read {db}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")
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


@db_app.command("backup")
def db_backup(
    file: Annotated[Path, typer.Argument(help="where to write the backup")],
    db: DbUrl = None,
    config: Annotated[Path | None, typer.Option("--config", "-c")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing file")] = False,
) -> None:
    """A consistent copy of the whole database while the broker runs (SQLite backup API,
    or pg_dump --format=custom on PostgreSQL)."""
    from broker.store.backup import BackupError, backup
    from broker.store.db import DatabaseURLError

    try:
        backup(_db_url(db, config), file, overwrite=force)
    except (BackupError, DatabaseURLError) as exc:
        _fail(str(exc))
    console.print(f"backup written to {file}")


@db_app.command("restore")
def db_restore(
    file: Annotated[Path, typer.Argument(help="a backup made by `isthmus db backup`")],
    db: DbUrl = None,
    config: Annotated[Path | None, typer.Option("--config", "-c")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="confirm: replaces the database")] = False,
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
    console.print(f"database restored from {file}; now run `isthmus db upgrade` and "
                  "`isthmus db check`")


@config_app.command("check")
def config_check(
    file: Path,
    show: Annotated[bool, typer.Option(
        "--show", help="also print every policy parameter in effect (defaults filled in)")
    ] = False,
) -> None:
    """Validate an isthmus.yaml and print a summary."""
    from broker.control.wiring import check_backends

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        _fail(str(exc), code=1)
    problems = check_backends(cfg)  # the server refuses to start on these too
    if problems:
        _fail("\n".join(f"{file}: {line}" for line in problems), code=1)
    console.print(
        f"{file}: OK: {len(cfg.backends)} backends, {len(cfg.pools)} pools, "
        f"{len(cfg.flavors)} flavors, {len(cfg.teams)} teams, auth {cfg.auth.mode}"
    )
    if show:
        import yaml

        shown = {"policies": cfg.policies.model_dump(mode="json")}
        print(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False), end="")


if __name__ == "__main__":
    app()
