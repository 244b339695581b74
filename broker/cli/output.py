"""Rendering for humans (rich tables) and scripts (--json)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped output is for logs and scripts: do not squeeze it into 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def job_table(jobs: list[dict[str, Any]]) -> Table:
    t = Table(show_header=True, header_style="bold")
    for col in ("ID", "NAME", "TEAM", "GPUS", "STATE", "REASON", "ATTEMPT", "CREATED"):
        t.add_column(col, no_wrap=col in ("ID", "STATE", "REASON"))
    for j in jobs:
        t.add_row(
            j["id"], j["name"], j["team"], str(j["total_gpus"]), j["state"], j["reason"],
            str(j["attempt"]), str(j["created_at"])[:19],
        )
    return t


def job_detail(j: dict[str, Any]) -> Table:
    t = Table(show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    gang = j["spec"]["gang"]
    for key, value in (
        ("id", j["id"]),
        ("name", j["name"]),
        ("team", f"{j['team']}  queue {j['queue']}  priority {j['priority']}"),
        ("gang", f"{gang['replicas']} x {gang['gpus_per_replica']} GPUs ({j['total_gpus']} total)"),
        ("flavors", ", ".join(j["spec"].get("flavors") or []) or "(by constraints)"),
        ("state", j["state"]),
        ("reason", j["reason"]),
        ("message", j["message"]),
        ("attempt", str(j["attempt"])),
        ("created", str(j["created_at"])),
        ("updated", str(j["updated_at"])),
    ):
        t.add_row(key, value)
    return t


def events_table(events: list[dict[str, Any]]) -> Table:
    t = Table(show_header=True, header_style="bold")
    for col in ("SEQ", "AT", "FROM", "TO", "REASON", "ACTOR", "MESSAGE"):
        t.add_column(col, no_wrap=col != "MESSAGE")
    for e in events:
        t.add_row(
            str(e["seq"]), str(e["at"])[:23], e["from_state"] or "-", e["to_state"],
            e["reason"], e["actor"], e["message"],
        )
    return t


def problem(status: int, body: dict[str, Any]) -> None:
    errors.print(f"[bold red]error {status}[/]: {body.get('title', '')}: {body.get('detail', '')}")
    for e in body.get("errors", []):
        errors.print(f"  [bold]{e.get('field')}[/]: {e.get('message')}")
