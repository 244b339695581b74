"""Rendering for humans (rich tables) and scripts (--json)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.domain.start_window import likely_of

# Piped output is for logs and scripts: do not squeeze it into 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def job_table(jobs: list[dict[str, Any]]) -> Table:
    t = Table(show_header=True, header_style="bold")
    for col in ("ID", "NAME", "TEAM", "GPUS", "STATE", "REASON", "QUEUE/ETA", "ATTEMPT",
                "CREATED"):
        t.add_column(col, no_wrap=col in ("ID", "STATE", "REASON", "QUEUE/ETA"))
    for j in jobs:
        t.add_row(
            j["id"], j["name"], j["team"], str(j["total_gpus"]), j["state"], j["reason"],
            wait_cell(j), str(j["attempt"]), str(j["created_at"])[:19],
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
        *native_rows(j["spec"].get("native")),
        ("state", j["state"]),
        ("reason", j["reason"]),
        ("message", j["message"]),
        ("attempt", str(j["attempt"])),
        *wait_rows(j),
        ("created", str(j["created_at"])),
        ("updated", str(j["updated_at"])),
    ):
        t.add_row(key, value)
    return t


def native_rows(native: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The job's native options (the team's escape hatch), as given."""
    if not native:
        return []
    rows = []
    if native.get("k8s"):
        overlay = json.dumps(native["k8s"]["pod_template"], sort_keys=True,
                             separators=(",", ":"))
        rows.append(("native k8s", f"pod_template {overlay}"))
    if native.get("slurm"):
        rows.append(("native slurm", " ".join(native["slurm"]["options"])))
    return rows


def wait_rows(j: dict[str, Any]) -> list[tuple[str, str]]:
    """Queue position and estimated start of a waiting job, as stored by admission."""
    w = j.get("wait")
    if not w or j.get("state") != "QUEUED":
        return []
    rows = []
    if w.get("position"):
        rows.append(("position", f"{w['position']} in the queue, {w['team_position']} in "
                                 f"team {j['team']}"))
    start = w.get("estimated_start")
    # no method: the job started waiting after the queue was last estimated (admission
    # estimates it every ESTIMATE_EVERY_S)
    method = w.get("estimate_method") or "not estimated yet"
    window = likely_of(w.get("start_window"))
    if window:
        rows.append(("start", window))
    rows.append(("estimated start",
                 f"{str(start)[:19]} ({method})" if start else method))
    rows.append(("as of", str(w.get("as_of"))[:19]))
    return rows


def wait_cell(j: dict[str, Any]) -> str:
    w = j.get("wait")
    if not w or j.get("state") != "QUEUED":
        return ""
    pos = f"#{w['position']}" if w.get("position") else ""
    start = w.get("estimated_start")
    eta = str(start)[5:16].replace("T", " ") if start else "?"
    window = likely_of(w.get("start_window"))
    return f"{pos} {eta}{f' ({window})' if window else ''}".strip()


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
    """A problem answer, once: the detail of a field error repeats its fields, so with field
    errors the title is followed by one line per field instead."""
    fields = body.get("errors") or []
    title = escape(str(body.get("title", "")))
    if fields:
        errors.print(f"[bold red]error {status}[/]: {title}")
        for e in fields:
            errors.print(f"  [bold]{escape(str(e.get('field')))}[/]: "
                         f"{escape(str(e.get('message')))}")
    else:
        errors.print(f"[bold red]error {status}[/]: {title}: "
                     f"{escape(str(body.get('detail', '')))}")


def hours(value: float) -> str:
    """GPU-hours (or cost) for a table: one decimal, but a small non-zero amount is not shown
    as 0.0 (two decimals, or '<0.01')."""
    if value == 0 or abs(value) >= 0.1:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.01 else "<0.01"
