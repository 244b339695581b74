#!/usr/bin/env python3
"""The demo workload: submits examples/jobs/demo/ to a running broker, shows a live table until
every job has ended, then checks that each reached the end its file's story promises.

The stories (what `scripts/demo` shows, and what tests/e2e/test_demo.py asserts):
- succeeds: QUEUED -> ADMITTED -> PREPARING -> RUNNING -> SUCCEEDED;
- retried: an infrastructure fault (FAILED, InfraTransient), RETRYING, then SUCCEEDED;
- preempted: stopped for a `high` job (RETRYING, Preempted), resumed, then SUCCEEDED;
- preempts: the `high` job, submitted once its victim runs; SUCCEEDED;
- rejected: REJECTED at once, saying why.

With --real (real clusters, `scripts/demo --real`) the `isthmus.io/sim-*` annotations, which
script the simulator, are left out (a real configuration refuses the reserved prefix), no fault
is injected and protection windows are the defaults, so every job but the rejected one is
expected to simply succeed; what happened is shown.

Usage: scripts/demo_workload.py [--server URL] [--plain] [--timeout S] [--json] [--real]
Exit status 0 when every job reached its expected end, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "demo"
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}

STORIES = {
    "bert-finetune": "succeeds",
    "llm-pretrain": "succeeds",
    "resnet-sweep": "succeeds",
    "cfd-surrogate": "succeeds",
    "flaky-node": "retried",
    "speech-low": "preempted",
    "urgent-eval": "preempts",
    "too-big": "rejected",
}
VICTIM, PREEMPTOR = "speech-low", "urgent-eval"
SIM_PREFIX = "isthmus.io/sim-"


def for_real(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without the simulator's annotations."""
    notes = {k: v for k, v in spec.get("annotations", {}).items() if not k.startswith(SIM_PREFIX)}
    out = {k: v for k, v in spec.items() if k != "annotations"}
    return {**out, "annotations": notes} if notes else out


@dataclass
class Tracked:
    name: str
    story: str
    spec: dict[str, Any]
    id: str | None = None
    job: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    submitted_at: float = 0.0
    ended_at: float | None = None

    @property
    def state(self) -> str:
        return str(self.job.get("state", "-"))

    def path(self) -> list[str]:
        return [e["to_state"] for e in self.events]

    def verdict(self) -> tuple[bool, str]:
        """(reached the story's end?, what happened, in a line)."""
        path, reasons = self.path(), [e["reason"] for e in self.events]
        seen = " -> ".join(_squash(path))
        if self.story == "rejected":
            return self.state == "REJECTED", f"REJECTED ({self.job.get('reason')})"
        if self.state != "SUCCEEDED":
            return False, f"ended {self.state} ({self.job.get('reason')}): {seen}"
        if self.story == "succeeded":
            return True, f"succeeded on attempt {self.job.get('attempt')}: {seen}"
        if self.story == "retried":
            ok = "FAILED" in path and "RETRYING" in path and any(
                r == "InfraTransient" for r in reasons)
            return ok, ("failed (InfraTransient), retried, succeeded on attempt "
                        f"{self.job['attempt']}")
        if self.story == "preempted":
            ok = any(e["to_state"] == "RETRYING" and e["reason"] == "Preempted"
                     for e in self.events)
            return ok, f"preempted, resumed, succeeded on attempt {self.job['attempt']}"
        return "RUNNING" in path, f"succeeded on attempt {self.job.get('attempt')}"


def _story(name: str, real: bool) -> str:
    story = STORIES.get(name, "succeeds")
    # a real reconcile pass every 5 s may not see a short job running: SUCCEEDED is enough
    return "succeeded" if real and story != "rejected" else story


def _squash(states: list[str]) -> list[str]:
    out: list[str] = []
    for s in states:
        if not out or out[-1] != s:
            out.append(s)
    return out


class Demo:
    def __init__(self, server: str, timeout: float, real: bool = False) -> None:
        self.http = httpx.Client(base_url=server.rstrip("/"), timeout=30)
        self.timeout = timeout
        specs = [yaml.safe_load(p.read_text()) for p in sorted(JOBS.glob("*.yaml"))]
        self.jobs = [
            Tracked(spec["name"], _story(spec["name"], real), for_real(spec) if real else spec)
            for spec in specs
        ]
        self.started = time.monotonic()

    def submit(self, t: Tracked) -> None:
        r = self.http.post("/v1/jobs", json=t.spec,
                           headers={"Idempotency-Key": f"demo-{t.name}-{self.started}"})
        if r.status_code >= 400:
            raise SystemExit(f"demo: {t.name} was refused (HTTP {r.status_code}): {r.text[:500]}")
        t.id, t.job, t.submitted_at = r.json()["id"], r.json(), time.monotonic()

    def refresh(self) -> None:
        for t in self.jobs:
            if t.id is None or (t.ended_at is not None and t.events):
                continue
            t.job = self.http.get(f"/v1/jobs/{t.id}").json()
            t.events = self.http.get(f"/v1/jobs/{t.id}/events").json()
            if t.state in ENDED and t.ended_at is None:
                t.ended_at = time.monotonic()

    def victim_running(self) -> bool:
        victim = next(t for t in self.jobs if t.name == VICTIM)
        return victim.state == "RUNNING"

    def step(self) -> bool:
        """One poll: submit the preemptor when its victim runs; True when all have ended."""
        self.refresh()
        waiting = [t for t in self.jobs if t.id is None]
        if waiting and (self.victim_running() or self.elapsed() > self.timeout / 2):
            for t in waiting:
                self.submit(t)
        return all(t.id is not None and t.state in ENDED for t in self.jobs)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def start(self) -> None:
        for t in self.jobs:
            if t.name != PREEMPTOR:
                self.submit(t)

    def table(self, width: int) -> Any:
        from rich.table import Table

        table = Table(title=f"Isthmus demo: {self.elapsed():5.1f} s", title_justify="left")
        cols = ["job", "team", "prio", "gang", "state", "reason", "try"]
        wide = width >= 120  # the message needs room; a narrow terminal shows it at the end
        for col in cols + (["message"] if wide else []):
            table.add_column(col, no_wrap=col != "message", overflow="fold")
        colours = {"SUCCEEDED": "green", "RUNNING": "cyan", "REJECTED": "red",
                   "FAILED": "red", "RETRYING": "yellow", "PREPARING": "blue"}
        for t in self.jobs:
            g = t.spec["gang"]
            c = colours.get(t.state, "white")
            row = [t.name, t.spec["team"], t.spec.get("priority", "normal"),
                   f"{g['replicas']}x{g['gpus_per_replica']}", f"[{c}]{t.state}[/]",
                   str(t.job.get("reason", "")), str(t.job.get("attempt", ""))]
            if wide:
                row.append(str(t.job.get("message", "not submitted yet"))[:160])
            table.add_row(*row)
        return table

    def run(self, live: bool) -> bool:
        self.start()
        deadline = self.started + self.timeout
        if live:
            from rich.console import Console
            from rich.live import Live

            console = Console()
            with Live(self.table(console.width), console=console, refresh_per_second=4) as view:
                while not self.step() and time.monotonic() < deadline:
                    view.update(self.table(console.width))
                    time.sleep(0.5)
                view.update(self.table(console.width))
        else:
            last: dict[str, str] = {}
            while not self.step() and time.monotonic() < deadline:
                self.log_changes(last)
                time.sleep(0.5)
            self.log_changes(last)
        return all(t.state in ENDED for t in self.jobs)

    def log_changes(self, last: dict[str, str]) -> None:
        for t in self.jobs:
            now = f"{t.state} {t.job.get('reason', '')}"
            if t.id is not None and last.get(t.name) != now:
                last[t.name] = now
                print(f"{self.elapsed():6.1f}s  {t.name:<14} {now}", flush=True)

    def report(self) -> list[dict[str, Any]]:
        out = []
        for t in self.jobs:
            ok, what = t.verdict()
            out.append({"name": t.name, "id": t.id, "story": t.story, "ok": ok,
                        "state": t.state, "what": what, "path": _squash(t.path()),
                        "ended_after_s": None if t.ended_at is None
                        else round(t.ended_at - self.started, 1)})
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="http://127.0.0.1:8080")
    ap.add_argument("--plain", action="store_true", help="log lines instead of a live table")
    ap.add_argument("--timeout", type=float, default=180.0, help="give up after this (s)")
    ap.add_argument("--json", action="store_true", help="print the outcome as JSON")
    ap.add_argument("--real", action="store_true",
                    help="real clusters: no simulator annotations, every job but too-big succeeds")
    args = ap.parse_args()
    demo = Demo(args.server, args.timeout, real=args.real)
    settled = demo.run(live=not args.plain and sys.stdout.isatty())
    outcome = demo.report()
    took = max((o["ended_after_s"] or 0.0) for o in outcome)
    good = settled and all(o["ok"] for o in outcome)
    if args.json:
        print(json.dumps({"ok": good, "settled_after_s": took, "jobs": outcome}, indent=2))
    else:
        print(f"\nAll {len(outcome)} jobs settled in {took:.0f} s:" if settled
              else f"\nNot settled after {args.timeout:.0f} s:")
        for o in outcome:
            mark = "ok  " if o["ok"] else "FAIL"
            print(f"  {mark} {o['name']:<14} {o['id'] or '-':<12} {o['story']:<10} {o['what']}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
