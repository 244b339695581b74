"""What every `isthmus` command shares: API options, error exits, API calls."""

from __future__ import annotations

import os
from typing import Annotated, Any, NoReturn

import typer

from broker.cli.output import errors
from broker.cli.output import problem as show_problem
from broker.client import ApiError, Client, TransportError

ServerUrl = Annotated[
    str, typer.Option("--server", envvar="ISTHMUS_URL", help="API base URL")
]
Token = Annotated[
    str | None,
    typer.Option("--token", envvar="ISTHMUS_TOKEN", help="API token (prefer the env var)",
                 show_default=False),
]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output (JSON)")]
JobId = Annotated[str, typer.Argument(help="the job's id (from `isthmus list`)")]
DEFAULT_URL = "http://127.0.0.1:8080"


def fail(message: str, code: int = 2) -> NoReturn:
    # one line however long (a path in it): a log or a script's grep reads the whole sentence
    errors.print(f"[bold red]error[/]: {message}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def client_settings(server: str, token: str | None) -> tuple[str, str | None]:
    """The API and token a command uses: `--server`/`--token`, else ISTHMUS_URL/ISTHMUS_TOKEN,
    else ~/.config/isthmus/client.yaml, the file the HPC drop-ins read (one loader:
    broker.dropins.client_config), else the local default."""
    if server != DEFAULT_URL and token is not None:
        return server, token
    from broker.dropins.client_config import ClientConfigError, load

    try:
        cfg = load(os.environ)
    except ClientConfigError as exc:
        fail(str(exc))
    return (server if server != DEFAULT_URL else cfg.url), (token if token is not None
                                                            else cfg.token)


def call(server: str, token: str | None, fn: str, *args: Any) -> Any:
    """One API call; a problem answer is printed once (title, then each field, or the detail)
    and exits 1; an unreachable API exits 2."""
    server, token = client_settings(server, token)
    try:
        with Client(server, token) as c:
            return getattr(c, fn)(*args)
    except ApiError as exc:
        show_problem(exc.status, exc.problem)
        raise typer.Exit(1) from None
    except TransportError as exc:
        fail(f"cannot reach the Isthmus API at {server}: {exc}")
