"""The job commands of `isthmus`: submit, plan, list, status, events, explain, attempts, render,
timeline, logs, cancel (registered on the app by broker.cli.main)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.common import DEFAULT_URL, AsJson, JobId, ServerUrl, Token, call, fail
from broker.cli.output import (
    console,
    emit_json,
    events_table,
    job_detail,
    job_table,
    native_rows,
)
from broker.domain.states import TERMINAL, JobState

SpecFile = Annotated[
    Path, typer.Option("-f", "--file", help="job spec (.json or .yaml; '-' reads stdin)")
]


def _read_spec(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text() if str(path) != "-" else typer.get_text_stream("stdin").read()
    except OSError as exc:
        fail(f"{path}: {exc.strerror}")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        fail(f"{path}: not valid JSON/YAML: {exc}")
    if not isinstance(data, dict):
        fail(f"{path}: a job spec must be a mapping")
    return data


def submit(
    file: Annotated[
        Path | None,
        typer.Option("-f", "--file", help="job spec (.json or .yaml; '-' reads stdin)"),
    ] = None,
    template: Annotated[
        str | None, typer.Option("--template", help="submit from this template "
                                 "(`isthmus templates` lists them) instead of a spec file"),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="with --template: PATH=VALUE, a field "
                                       "the template lets you change (repeatable)"),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="with --template: the job's name")
                    ] = None,
    team: Annotated[str | None, typer.Option("--team", help="with --template: the job's team "
                                             "(default: your token's)")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key",
                     help="the same key and spec return the same job instead of a new one"),
    ] = None,
    server: ServerUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Submit a job spec (-f), or a job from a template (--template NAME --name JOB
    --set gang.replicas=4)."""
    if (file is None) == (template is None):
        fail("give a spec file (-f FILE) or a template (--template NAME), one of the two")
    if template is not None:
        from broker.config_templates import TemplateError, parse_override

        if not name:
            fail("--template needs the job's --name")
        try:
            pairs = dict(parse_override(o) for o in overrides or [])
        except TemplateError as exc:
            fail(str(exc))
        body: dict[str, Any] = {"name": name, "set": pairs}
        if team:
            body["team"] = team
        job = call(server, token, "submit_template", template, body, idempotency_key)
    else:
        if overrides or name or team:
            fail("--set, --name and --team go with --template")
        assert file is not None
        job = call(server, token, "submit", _read_spec(file), idempotency_key)
    if as_json:
        emit_json(job)
    else:
        console.print(f"[bold]{job['id']}[/] {job['state']} ({job['reason']}): {job['message']}",
                      markup=True, highlight=False)


def templates(server: ServerUrl = DEFAULT_URL, token: Token = None,
              as_json: AsJson = False) -> None:
    """The job templates your team may use: name, what you may change, description."""
    rows = call(server, token, "templates")
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no templates are offered to your team", markup=False)
    for t in rows:
        allow = ", ".join(t["allow"]) or "nothing"
        console.print(f"{t['name']}: {t['description']} (you may set: name, team, {allow})",
                      markup=False, highlight=False)


def plan(file: SpecFile, server: ServerUrl = DEFAULT_URL, token: Token = None,
         as_json: AsJson = False) -> None:
    """What admission would decide for a spec now (like `sbatch --test-only`): every pool's
    verdict, the placement or the reason, and the estimated start. Nothing is submitted.
    Exits 1 when the job would be rejected (as `isbatch --test-only` does)."""
    data = call(server, token, "plan", _read_spec(file))
    if as_json:
        emit_json(data)
        if data["would_reject"]:
            raise typer.Exit(1)
        return
    if data["would_reject"]:
        console.print(f"would be REJECTED ({data['reason']}): {data['message']}", markup=False)
        raise typer.Exit(1)
    if data["explanation"] is None:
        console.print(f"valid ({data['reason']}): {data['message']}", markup=False)
    else:
        text = _explanation_text(data)
        console.print(text.replace("job plan: ", "plan: ", 1), markup=False)
        if data.get("queued_ahead") is not None:
            console.print(f"  jobs queued ahead of it: {data['queued_ahead']}", markup=False)
    if data.get("note"):
        console.print(f"  note: {data['note']}", markup=False)


def status(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
           as_json: AsJson = False) -> None:
    """Show one job: state, reason, message, and for a waiting job its queue position and
    estimated start."""
    job = call(server, token, "job", job_id)
    emit_json(job) if as_json else console.print(job_detail(job))


def _states(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    known = {s.value for s in JobState}
    out = []
    for v in values:
        for part in v.split(","):
            s = part.strip().upper()
            if s not in known:
                fail(f"--state {part!r}: not a state; use one of {', '.join(sorted(known))}")
            out.append(s)
    return out


def list_(
    team: Annotated[str | None, typer.Option(help="only this team's jobs (admins)")] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(help="only jobs in this state, any case (repeatable, or comma-separated)"),
    ] = None,
    limit: Annotated[int, typer.Option(help="jobs per page (1-500)")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="continue from the next_cursor of a previous page")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="follow next_cursor to the last page")
    ] = False,
    server: ServerUrl = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first, with queue position and estimated start of waiting ones."""
    states = _states(state)
    page = call(server, token, "jobs", team, states, limit, cursor)
    items = list(page["items"])
    while all_ and page.get("next_cursor"):
        page = call(server, token, "jobs", team, states, limit, page["next_cursor"])
        items += page["items"]
    if as_json:
        emit_json({"items": items, "next_cursor": page.get("next_cursor")})
        return
    console.print(job_table(items))
    if page.get("next_cursor") and not all_:
        console.print(f"more: --cursor {page['next_cursor']} (or --all)", markup=False)


def events(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
           as_json: AsJson = False) -> None:
    """Show a job's event history."""
    evs = call(server, token, "events", job_id)
    emit_json(evs) if as_json else console.print(events_table(evs))


def explain(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
            as_json: AsJson = False) -> None:
    """Why a job waits: the latest admission verdicts per pool, most severe reason first; for
    a REJECTED job, the rejection."""
    data = call(server, token, "explain", job_id)
    if as_json:
        emit_json(data)
        return
    console.print(f"{job_id} {data['state']} ({data['reason']}): {data['message']}",
                  markup=False)
    for key, value in native_rows(data.get("native")):
        console.print(f"  {key}, as given: {value}", markup=False)
    if data["state"] == "REJECTED":
        console.print("  rejected when validated: it can never run with this configuration; "
                      "the reason says which limit and by how much", markup=False)
        return
    if data["reason"] == "AwaitingApproval":
        console.print("  awaits an admin's approval of its priority class before admission "
                      "considers it (isthmus admin approve / refuse)", markup=False)
        return
    if data["explanation"] is None:
        console.print("  not yet considered by an admission cycle", markup=False)
        return
    console.print(f"  as of {data['considered_at']}", markup=False)
    console.print(_explanation_text(data), markup=False)


def _explanation_text(data: dict[str, Any]) -> str:
    """The server renders the explanation (`text`): the CLI renders wire JSON and imports no
    policy. A server too old to send it gets its JSON shown as it came."""
    if data.get("text") is not None:
        return str(data["text"])
    return json.dumps(data["explanation"], indent=2)


def attempts(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
             as_json: AsJson = False) -> None:
    """Every attempt: placement, backend object, phase, start, end and failure."""
    from rich.table import Table

    rows = call(server, token, "attempts", job_id)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print(f"job {job_id} has no attempt yet (not admitted)", markup=False)
        return
    t = Table(show_header=True, header_style="bold")
    for col in ("#", "POOL", "FLAVOR", "BACKEND OBJECT", "DISPATCH", "PHASE", "STARTED",
                "ENDED", "FAILURE"):
        t.add_column(col)
    for a in rows:
        obj = f"{a['backend']}/{a['backend_name']}" if a["dispatch"] == "created" else "(none)"
        t.add_row(str(a["number"]), a["pool"], a["flavor"], obj, a["dispatch"], a["phase"],
                  str(a["started_at"] or "")[:19], str(a["ended_at"] or "")[:19],
                  ("preempted" if a["preempted"] else a["failure"] or ""))
    console.print(t)


def render(
    job_id: JobId,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: the last)")] = None,
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """Print the exact batch script or manifests an attempt was created with."""
    rows = call(server, token, "attempts", job_id)
    if not rows:
        fail(f"job {job_id} has no attempt yet: it was never admitted, so nothing was "
             "rendered", code=1)
    chosen = rows[-1] if attempt is None else next(
        (a for a in rows if a["number"] == attempt), None)
    if chosen is None:
        fail(f"job {job_id} has no attempt {attempt} (it has {len(rows)})", code=1)
    if chosen["dispatch"] != "created":
        fail(f"attempt {chosen['number']} of job {job_id} has no backend object "
             f"(dispatch: {chosen['dispatch']}), so there is nothing rendered to show", code=1)
    text = call(server, token, "render", job_id, chosen["number"])
    if as_json:
        emit_json({"job_id": job_id, "attempt": chosen["number"], "rendered": text})
    else:
        print(text, end="")


def timeline(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
             as_json: AsJson = False) -> None:
    """Per attempt, the phases from queueing to the end with durations, as a bar chart."""
    from datetime import datetime

    from broker.timeline import AttemptTimeline, Phase, bar_chart

    data = call(server, token, "timeline", job_id)
    if as_json:
        emit_json(data)
        return

    def at(v: str | None) -> datetime | None:
        return datetime.fromisoformat(v) if v else None

    lines = [
        AttemptTimeline(
            a["number"], a["pool"],
            [Phase(p["name"], datetime.fromisoformat(p["start"]), at(p["end"]), p["note"])
             for p in a["phases"]],
            a["outcome"], at(a["ended_at"]),
        )
        for a in data["attempts"]
    ]
    console.print(f"{job_id} {data['state']} ({data['reason']})", markup=False)
    console.print(bar_chart(lines, datetime.fromisoformat(data["now"])), markup=False)


def logs(
    job_id: JobId,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: the last)")] = None,
    rank: Annotated[int | None, typer.Option(help="one rank only (default: every rank)")] = None,
    tail: Annotated[int | None, typer.Option(help="only the last N lines of each rank")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-F",
                                         help="keep printing new output until the job ends")]
    = False,
    interval: Annotated[float, typer.Option(help="seconds between polls with --follow")] = 2.0,
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """The output of each rank, read through the backend: Slurm's output file, Kubernetes pod
    logs, the simulator's synthetic log."""
    data = call(server, token, "logs", job_id, attempt, rank, tail)
    if as_json and not follow:
        emit_json(data)
        return
    printer = _RankPrinter(as_json)
    printer.show(data)
    attempt = data["attempt"]
    if follow and tail is not None:  # later polls read everything: skip what came before
        printer.skip(call(server, token, "logs", job_id, attempt, rank, None))
    while follow:
        job = call(server, token, "job", job_id)
        ended = job["state"] in TERMINAL or job["attempt"] != attempt
        printer.show(call(server, token, "logs", job_id, attempt, rank, None))
        if ended:
            break
        time.sleep(interval)  # polling the API is what --follow is


class _RankPrinter:
    """Prints the ranks' logs of successive polls, each line once (the text of each rank
    after what was printed of it before), with a rank prefix when there are several."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.seen: dict[str, int] = {}

    def skip(self, d: dict[str, Any]) -> None:
        for r in d["ranks"]:
            self.seen[f"{r['rank']}|{r['source']}"] = len(r["text"])

    def show(self, d: dict[str, Any]) -> None:
        many = len(d["ranks"]) > 1
        for r in d["ranks"]:
            key = f"{r['rank']}|{r['source']}"
            text = r["text"][self.seen.get(key, 0):]
            if key not in self.seen and r["note"]:
                typer.echo(f"== rank {r['rank'] if r['rank'] is not None else 'all'} "
                           f"({r['source']}): {r['note']}", err=True)
            self.seen[key] = len(r["text"])
            if self.as_json:
                if text:
                    emit_json({"rank": r["rank"], "source": r["source"], "text": text})
                continue
            prefix = f"[{r['rank']}] " if many and r["rank"] is not None else ""
            for line in text.splitlines():
                typer.echo(f"{prefix}{line}")
        if not d["ranks"] and d.get("note"):
            typer.echo(d["note"], err=True)


def cancel(job_id: JobId, server: ServerUrl = DEFAULT_URL, token: Token = None,
           as_json: AsJson = False) -> None:
    """Cancel a job that has not ended."""
    job = call(server, token, "cancel", job_id)
    if as_json:
        emit_json(job)
    else:
        console.print(f"{job['id']} {job['state']} ({job['reason']})", markup=False)


COMMANDS = (
    ("submit", submit), ("plan", plan), ("list", list_), ("status", status),
    ("events", events), ("explain", explain), ("attempts", attempts), ("render", render),
    ("timeline", timeline), ("logs", logs), ("cancel", cancel), ("templates", templates),
)
