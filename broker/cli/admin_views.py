"""The view commands of `isthmus`: pools, quotas, report usage, decisions, admin cycles
(registered on the app by broker.cli.main). Tables for people, `--json` (and `--csv` for
reports) for scripts."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

import typer
from rich.table import Table

from broker.cli.common import DEFAULT_URL, AsJson, JobId, ServerUrl, Token, call, fail
from broker.cli.output import console, emit_json, hours

report_app = typer.Typer(no_args_is_help=True, help="Reports (GPU-hours, cost, waste).",
                         rich_markup_mode=None)


def _table(columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Table:
    t = Table(show_header=True, header_style="bold")
    for col in columns:
        t.add_column(col, justify="left" if col.isalpha() and col in columns[:2] else "right")
    for row in rows:
        t.add_row(*(str(c) for c in row))
    return t


def pools(server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """Every pool: GPUs total, free, held by Isthmus and by others, queued (Isthmus, the
    backend's own), largest free rack, drain, reachability and inventory age."""
    views = call(server, token, "pool_views")
    if as_json:
        emit_json(views)
        return
    rows = []
    for p in views:
        age = p["inventory_age_s"]
        state = ("drained" if p["drained"] else "open") + ("" if p["reachable"] else
                                                            ", unreachable")
        rows.append((p["name"], p["flavor"], p["capacity_gpus"], p["free_gpus"],
                     p["isthmus_gpus"], p["foreign_gpus"], p["queued_isthmus_gpus"],
                     p["queued_foreign_gpus"], p["largest_free_rack"], state,
                     "-" if age is None else f"{age:.0f}s"))
    console.print(_table(("POOL", "FLAVOR", "GPUS", "FREE", "ISTHMUS", "FOREIGN", "Q-OURS",
                          "Q-FOREIGN", "RACK-FREE", "STATE", "AGE"), rows))
    for p in views:
        if p["drained"] and p["drain_reason"]:
            console.print(f"{p['name']}: drained: {p['drain_reason']}", markup=False)
        if not p["reachable"]:
            console.print(f"{p['name']}: {p['note']}", markup=False)
        if p.get("isthmus_unseen_gpus"):
            console.print(f"{p['name']}: {p['isthmus_unseen_gpus']} GPUs of Isthmus attempts "
                          "are not seen on the nodes (the backend lost them; reconciliation "
                          "ends those attempts)", markup=False)


def _share(line: dict[str, Any]) -> str:
    """`50% (h100-80g 16/16, a100-80g 0/32)`, or `-` for a queue without a share."""
    share = line.get("share")
    if share is None:
        return "-"
    held = line.get("gpus_held_by_flavor") or {}
    per = ", ".join(f"{f} {held.get(f, 0)}/{c}" for f, c in (line.get("share_gpus") or {}).items())
    return f"{share * 100:.3g}%" + (f" ({per})" if per else "")


def quotas(server: ServerUrl = DEFAULT_URL, token: Token = None,
           as_json: AsJson = False) -> None:
    """Per team and flavor: nominal, borrowing and lending limits, used, borrowed, lent out,
    waiting demand; then the teams' queues with their weights and standing, then the
    concurrency limits per team and user against their counts, then the GPU-hour budgets in
    their current periods (a team token sees its team). --json prints the quota lines only
    (GET /v1/queues, GET /v1/limits and GET /v1/budgets have the others)."""
    views = call(server, token, "quota_views")
    if as_json:
        emit_json(views)
        return

    def limit(v: int | None) -> str:
        return "-" if v is None else str(v)

    rows = [(q["team"], q["flavor"], q["nominal"], limit(q["borrowing_limit"]),
             limit(q["lending_limit"]), q["used"], q["borrowed"], q["lent_out"],
             f"{q['waiting_gpus']} ({q['waiting_jobs']} jobs)") for q in views]
    console.print(_table(("TEAM", "FLAVOR", "NOMINAL", "BORROW-LIMIT", "LEND-LIMIT", "USED",
                          "BORROWED", "LENT", "WAITING"), rows))
    lines = call(server, token, "queue_views")
    per_team = Counter(v["team"] for v in lines)
    shared = {v["team"] for v in lines if v.get("share") is not None}
    # teams with queues of their own
    queues = [v for v in lines if per_team[v["team"]] > 1 or v["team"] in shared]
    if queues:
        console.print("Team queues (GPUs held per unit of weight: the lowest goes next within "
                      "its team; SHARE: the most of the team's quota the queue may hold, "
                      "held/allowed per flavor; GET /v1/queues for scripts):", markup=False)
        console.print(_table(("TEAM", "TEAM-WEIGHT", "QUEUE", "WEIGHT", "SHARE", "GPUS-HELD",
                              "PER-WEIGHT", "WAITING"), [
            (v["team"], f"{v['team_weight']:g}",
             v["queue"] + ("" if v.get("configured", True) else " (not configured)"),
             f"{v['weight']:g} ({v['weight_fraction']:.0%})", _share(v), v["gpus_held"],
             f"{v['held_per_weight']:g}", v["waiting_jobs"]) for v in queues]))
    lines = call(server, token, "limit_views")

    def of(used: int, cap: int | None) -> str:
        return f"{used}" if cap is None else f"{used}/{cap}"

    if lines:
        console.print("Concurrency limits (used/limit; GET /v1/limits for scripts):",
                      markup=False)
        console.print(_table(("TEAM", "USER", "RUNNING-JOBS", "QUEUED-JOBS", "GPUS"), [
            (v["team"], v["user"] or "(team)", of(v["running_jobs"], v["running_jobs_limit"]),
             of(v["queued_jobs"], v["queued_jobs_limit"]), of(v["gpus"], v["gpus_limit"]))
            for v in lines]))
    budgets = call(server, token, "budget_views")
    if budgets:
        console.print("GPU-hour budgets (this period; GET /v1/budgets for scripts):",
                      markup=False)
        console.print(_table(("TEAM", "USER", "PERIOD", "USED/BUDGET GPU-H", "STATE",
                              "ENFORCE", "RENEWS"), [
            (b["team"], b["user"] or "(team)", b["period"],
             f"{b['used_gpu_hours']:.1f}/{b['gpu_hours']:g} ({b['fraction']:.0%})",
             b["state"], b["enforce"], str(b["renews_at"])[:16].replace("T", " "))
            for b in budgets]))


By = Annotated[str, typer.Option("--by", help="team, pool, flavor or user")]


@report_app.command("usage")
def report_usage(
    start: Annotated[str | None, typer.Option("--from", help="ISO date or time (UTC)")] = None,
    end: Annotated[str | None, typer.Option("--to", help="exclusive; ISO date or time")] = None,
    by: By = "team",
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV, one line per group")] = False,
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """GPU-hours used, cost and wasted GPU-hours by kind of the attempts that ended in
    [--from, --to), per team, pool, flavor or user."""
    if by not in ("team", "pool", "flavor", "user"):
        fail(f"--by: one of team, pool, flavor, user (not {by!r})")
    if as_csv and as_json:
        fail("--csv and --json: choose one")
    if as_csv:
        typer.echo(call(server, token, "usage_report", start, end, by, "csv"), nl=False)
        return
    report = call(server, token, "usage_report", start, end, by, "json")
    if as_json:
        emit_json(report)
        return
    rows = [(line["key"], *(hours(line[k]) for k in (
                "gpu_hours", "cost", "wasted_gpu_hours", "waste_preparing", "waste_failed",
                "waste_lost", "waste_preempted", "waste_cancelled")))
            for line in [*report["lines"], report["total"]]]
    console.print(_table((by.upper(), "GPU-H", "COST", "WASTED", "PREPARING", "FAILED", "LOST",
                          "PREEMPTED", "CANCELLED"), rows))
    unpriced = report["total"]["unpriced_gpu_hours"]
    if unpriced:
        console.print(f"{unpriced:.1f} GPU-hours were booked before costs were recorded "
                      "and have no cost", markup=False)


def decisions(job_id: JobId, limit: Annotated[int, typer.Option(help="at most")] = 20,
              server: ServerUrl = DEFAULT_URL, token: Token = None,
              as_json: AsJson = False) -> None:
    """The admission cycles' decisions about a job, newest first, with every pool's verdict."""
    rows = call(server, token, "decisions", job_id, limit)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print(f"job {job_id}: no decision logged (not considered yet, or pruned)",
                      markup=False)
    for d in rows:
        verdict = f"admitted to {d['placement_pool']}" if d["admitted"] else d["reason"]
        again = f", repeated in {d['repeated_in']} later cycles" if d["repeated_in"] else ""
        console.print(f"cycle {d['cycle_id']} at {d['at']} (inputs {d['inputs_digest']}): "
                      f"{verdict}{again}: {d['message']}", markup=False)
        for v in d["pools"]:
            console.print(f"  {v['pool']}: {'fits' if v['fits'] else v['reason']}"
                          f"{': ' + v['message'] if v['message'] else ''}", markup=False)
        for v in d["victims"]:
            console.print(f"  victim {v['job_id']} ({v['team']}, {v['gpus']} GPUs on "
                          f"{v['pool']}): {v['reason']}", markup=False)


def admin_cycles(limit: Annotated[int, typer.Option(help="at most")] = 20,
                 before: Annotated[int | None, typer.Option(help="older than this id")] = None,
                 server: ServerUrl = DEFAULT_URL, token: Token = None,
                 as_json: AsJson = False) -> None:
    """Admission cycles, newest first: pending, admitted, waiting by reason, victims."""
    rows = call(server, token, "cycles", limit, before)
    if as_json:
        emit_json(rows)
        return
    table = [(c["id"], c["at"], c["inputs_digest"], c["pending"], c["admitted"],
              ", ".join(f"{k} {v}" for k, v in c["reasons"].items()) or "-",
              len(c["victims"]), c["decisions_logged"], c.get("repeats", 0)) for c in rows]
    console.print(_table(("ID", "AT", "DIGEST", "PENDING", "ADMITTED", "WAITING", "VICTIMS",
                          "LOGGED", "REPEATS"), table))


def admin_audit(
    actor: Annotated[str | None, typer.Option(help="a token's or user's name",
                                              show_default=False)] = None,
    action: Annotated[str | None, typer.Option(help="job.submit, job.cancel, pool.drain, "
                                               "job.approve, read, ...",
                                               show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="job:ID, pool:NAME, team:NAME, ...",
                                               show_default=False)] = None,
    since: Annotated[str | None, typer.Option(help="ISO time, inclusive (UTC unless given)",
                                              show_default=False)] = None,
    until: Annotated[str | None, typer.Option(help="ISO time, exclusive",
                                              show_default=False)] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="records per page")] = 50,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of a previous page",
                                               show_default=False)] = None,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="export every matching record, "
                                        "oldest first, as JSON lines")] = False,
    server: ServerUrl = DEFAULT_URL, token: Token = None, as_json: AsJson = False,
) -> None:
    """The audit log, newest first: who did what to which target, when, with what outcome
    (every state-changing call and every admin read of another team's data)."""
    if jsonl and as_json:
        fail("--jsonl and --json: choose one")
    if jsonl:
        typer.echo(call(server, token, "audit_export", actor, action, target, since, until),
                   nl=False)
        return
    page = call(server, token, "audit", actor, action, target, since, until, limit, cursor)
    if as_json:
        emit_json(page)
        return
    rows = [(r["seq"], str(r["at"])[:19].replace("T", " "),
             r["actor"] + (" (admin)" if r["actor_admin"] else ""), r["action"], r["target"],
             f"{r['outcome']} {r['status']}", r["request_id"]) for r in page["items"]]
    t = Table(show_header=True, header_style="bold")
    for col in ("SEQ", "AT", "ACTOR", "ACTION", "TARGET", "OUTCOME", "REQUEST"):
        t.add_column(col, justify="right" if col == "SEQ" else "left")
    for row in rows:
        t.add_row(*(str(c) for c in row))
    console.print(t)
    if page["next_cursor"]:
        console.print(f"older: --cursor {page['next_cursor']}", markup=False)


COMMANDS = (("pools", pools), ("quotas", quotas), ("decisions", decisions))
