"""The README's command table and API table cover every command and route, and name no other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from broker.api.app import create_app
from broker.cli.main import app as cli_app
from broker.config import load_config
from broker.store import open_database

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
NOT_IN_OPENAPI = {("GET", "/metrics")}


def _section(title: str) -> str:
    start = README.index(title)
    nxt = re.search(r"^#{2,3} ", README[start + len(title):], re.M)
    return README[start:start + len(title) + (nxt.start() if nxt else len(README))]


def _cli_paths(cmd: Any, prefix: tuple[str, ...] = ()) -> set[str]:
    subs = getattr(cmd, "commands", None)  # a group (typer vendors its own click)
    if subs:
        out: set[str] = set()
        for name, sub in subs.items():
            out |= _cli_paths(sub, (*prefix, name))
        return out
    return {" ".join(prefix)}


def test_every_command_is_in_the_readme_table() -> None:
    table = _section("### Commands")
    listed = set()
    for cell in re.findall(r"^\| `isthmus ([^`]*)`", table, re.M):
        words = []
        for w in cell.split():
            if w.startswith("-") or not w.replace("-", "").isalpha() or not w.islower():
                break
            words.append(w)
        listed.add(" ".join(words))
    commands = _cli_paths(typer.main.get_command(cli_app))
    assert commands == listed, (
        f"missing from README: {sorted(commands - listed)}; "
        f"not commands: {sorted(listed - commands)}"
    )


def test_every_route_is_in_the_readme_api_table(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "examples" / "isthmus.yaml")
    db = open_database(f"sqlite:///{tmp_path}/readme.db")
    try:
        spec = create_app(cfg, db).openapi()
    finally:
        db.dispose()
    routes = {
        (method.upper(), path.replace("{job_id}", "{id}"))
        for path, ops in spec["paths"].items() for method in ops
    }
    table = _section("## API")
    listed = {
        (m, p.split("?")[0])
        for m, p in re.findall(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/[^`]*)`", table, re.M)
    }
    assert routes <= listed, f"missing from README: {sorted(routes - listed)}"
    assert listed <= routes | NOT_IN_OPENAPI, f"not routes: {sorted(listed - routes)}"
