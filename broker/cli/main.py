"""`isthmus`: run the server, submit and inspect jobs, check the database and configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.cli import admin_views, jobs
from broker.cli.common import DEFAULT_URL, AsJson, ServerUrl, Token, call, fail
from broker.cli.db import DB_ENV, DbUrl, db_app
from broker.cli.hpc import hpc_app
from broker.cli.output import console, emit_json

# rich_markup_mode=None: plain click help, where a boolean flag reads `--json`, not
# `--json <bool>`
app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__,
                  rich_markup_mode=None)
config_app = typer.Typer(no_args_is_help=True, help="Configuration checks.",
                         rich_markup_mode=None)
app.add_typer(db_app, name="db")  # broker/cli/db.py
admin_app = typer.Typer(no_args_is_help=True, help="Platform operations (admin token).",
                        rich_markup_mode=None)
app.add_typer(config_app, name="config")
app.add_typer(admin_app, name="admin")
app.add_typer(hpc_app, name="hpc")  # broker/cli/hpc.py


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
    from broker.config import ConfigError
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
    from broker.config import ConfigError
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
admin_app.command("audit")(admin_views.admin_audit)
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


@admin_app.command("approve")
def admin_approve(job_id: Annotated[str, typer.Argument(help="the job's id or number")],
                  note: Annotated[str, typer.Option("--note", help="shown in its event")] = "",
                  server: ServerUrl = DEFAULT_URL, token: Token = None,
                  as_json: AsJson = False) -> None:
    """Approve a job whose priority class needs approval (it goes to admission)."""
    j = _call(server, token, "approve", job_id, note)
    emit_json(j) if as_json else console.print(f"{j['id']}: {j['state']} ({j['reason']}): "
                                               f"{j['message']}", markup=False)


@admin_app.command("refuse")
def admin_refuse(job_id: Annotated[str, typer.Argument(help="the job's id or number")],
                 reason: Annotated[str, typer.Option("--reason", help="why (shown to its "
                                                     "owner)")],
                 server: ServerUrl = DEFAULT_URL, token: Token = None,
                 as_json: AsJson = False) -> None:
    """Refuse a job whose priority class needs approval (it ends CANCELLED, ApprovalRefused)."""
    j = _call(server, token, "refuse", job_id, reason)
    emit_json(j) if as_json else console.print(f"{j['id']}: {j['state']} ({j['reason']}): "
                                               f"{j['message']}", markup=False)


@admin_app.command("approvals")
def admin_approvals(server: ServerUrl = DEFAULT_URL, token: Token = None,
                    as_json: AsJson = False) -> None:
    """Jobs waiting for an admin's approval, oldest first."""
    rows = _call(server, token, "approvals")
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no job awaits approval", markup=False)
    for j in rows:
        console.print(f"{j['number'] or j['id']:<12} {j['team']:<16} {j['submitted_by']:<16} "
                      f"{j['priority']:<10} {j['total_gpus']:>5} GPUs  {j['name']}",
                      markup=False)


@admin_app.command("notices")
def admin_notices(
    dead: Annotated[bool, typer.Option("--dead", help="only the dead-letter view (attempts "
                                       "spent)")] = False,
    status: Annotated[str | None, typer.Option(help="pending, delivered or dead")] = None,
    team: Annotated[str | None, typer.Option(help="one team's notices")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """Notice deliveries (webhooks, mail), newest first, with attempts and last error."""
    rows = _call(server, token, "notices", "dead" if dead else status, team, limit)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no notice deliveries", markup=False)
    for d in rows:
        console.print(f"{d['id']:<6} {d['status']:<9} {d['kind']:<16} {d['team']:<12} "
                      f"{d['job_id'] or '-':<16} {d['channel']:<7} {d['target']}  "
                      f"tries {d['attempts']}  {d['last_error']}", markup=False)


@admin_app.command("notice-retry")
def admin_notice_retry(
    delivery_id: Annotated[int, typer.Argument(help="a dead delivery's id (admin notices)")],
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """Send a dead notice delivery again (a fresh set of attempts)."""
    rows = _call(server, token, "retry_notice", delivery_id)
    emit_json(rows) if as_json else console.print(
        f"delivery {delivery_id}: pending again", markup=False)


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


@config_app.command("check")
def config_check(
    file: Annotated[Path, typer.Argument(help="the isthmus.yaml to check")],
    as_json: AsJson = False,
    show: Annotated[bool, typer.Option(
        "--show", help="also print every policy parameter in effect (defaults filled in)")
    ] = False,
) -> None:
    """Validate an isthmus.yaml as the server does when it starts (all but binding its port
    and opening its database) and print a summary."""
    from broker.config import ConfigError, load_config
    from broker.server import ServerError, check_config

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        _fail(str(exc), code=1)
    try:
        check_config(cfg, file, cfg.server.host)  # the server's own start-up check
    except ServerError as exc:
        _fail(str(exc), code=1)
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
